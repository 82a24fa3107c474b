// Collectives on device memory through host memory, for MPI, which reads and writes host memory
// only. An all-reduce goes in chunks through the pipeline of staging.hpp: where the device has
// background copies (Allocator::make_async_copier) its slots are the copier's host memory (pinned
// on a GPU) and the copies overlap MPI; elsewhere they are synchronous. The rest is staged whole: in
// reduce-scatter, all-gather and all-to-all every rank's block takes part in every step, and
// broadcast, send and recv must post the messages their peers expect whatever memory those use. Host-side buffers of an operation are used as they are. Every rank
// of a group stages an all-reduce alike (all on device memory, or all on host memory).
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
  std::vector<std::byte> send_, receive_;
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
  // The pipeline's chunk slots, at least `bytes` each: from the copier's host memory, or plain.
  std::byte* slot(int index, std::size_t bytes);

  Allocator& device_;
  std::size_t chunk_bytes_;
  std::unique_ptr<AsyncCopier> copier_;  // null: synchronous copies
  std::vector<Buffer> copier_slots_;      // before the copier goes: its memory holds them
  std::vector<std::vector<std::byte>> plain_slots_;
};

}  // namespace mlptrain
