// Collectives on device memory through host memory, for MPI, which reads and writes host memory
// only. A blocking all-reduce goes in chunks through the pipeline of staging.hpp: where the device
// has background copies (Allocator::make_async_copier) the copies overlap MPI; elsewhere they are
// synchronous. The rest is staged whole: in reduce-scatter, all-gather and all-to-all every rank's
// block takes part in every step, broadcast, send and recv must post the messages their peers
// expect whatever memory those use, and a non-blocking operation runs while the host goes on.
// All host memory here is the copier's (pinned on a GPU: its copy engines reach pageable memory
// only through the driver's own bounce buffers) or else the host's, cached by size class, so a
// step's operations reuse the blocks of the last one rather than fault in fresh pages. Host-side
// buffers of an operation are used as they are. Every rank of a group stages an all-reduce alike
// (all on device memory, or all on host memory).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"

namespace mlptrain {

// One operation moved to host memory: the same operation on host buffers, and after it has
// completed, the copy of what it received back to where the caller wants it.
class StagedOperation {
 public:
  const Operation& host() const { return host_; }
  void finish();

 private:
  friend class HostStaging;
  Allocator* device_ = nullptr;
  Operation host_;
  Buffer send_, receive_;
  void* destination_ = nullptr;  // where the received bytes [offset, offset + bytes) go
  std::size_t down_offset_ = 0, down_bytes_ = 0;
};

class HostStaging {
 public:
  // `device`: the allocator whose memory is staged (its copies move the data).
  explicit HostStaging(Allocator& device, std::size_t chunk_bytes = std::size_t{4} << 20);

  // Whether a buffer of `operation` lies in device memory.
  bool stages(const Operation& operation) const;
  // Stages `operation` whole for rank `rank` of `group_size`: its data is in host memory when
  // this returns, and the result goes back when the operation's finish() is called.
  std::shared_ptr<StagedOperation> stage(const Operation& operation, int rank, int group_size);
  // A blocking all-reduce in chunks through the pipeline: `run_host` all-reduces one chunk in
  // place in host memory.
  void all_reduce(const Operation& operation, const std::function<void(const Operation&)>& run_host);

 private:
  // The pipeline's chunk slots, at least `bytes` each.
  std::byte* slot(int index, std::size_t bytes);
  Allocator& host_memory() { return copier_ ? copier_->host_memory() : own_host_memory_; }

  Allocator& device_;
  std::size_t chunk_bytes_;
  MemoryLedger own_ledger_;  // the host memory staged through where the device has no copier
  HostAllocator own_host_memory_{own_ledger_};
  std::unique_ptr<AsyncCopier> copier_;  // null: synchronous copies
  std::vector<Buffer> slots_;             // after the memory that holds them, so they go first
};

}  // namespace mlptrain
