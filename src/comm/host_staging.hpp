// Collectives on device memory through host memory, for MPI, which reads and writes host memory
// only. Every operation flows as a pipeline of pieces (staging_plan.hpp) run by the rank's
// communication engine:
//   1. when the operation is started, on the launching thread, each piece's copies down are
//      queued on the device's copy stream behind an event of the compute stream (the kernels
//      that made the data), never a wait of the launching thread;
//   2. the engine issues a piece's MPI operations on host memory as soon as its copies landed,
//      while later pieces still come down;
//   3. once they complete, the piece's copies up are queued, after the compute stream's work
//      that was queued before the operation started (it may still read the destination);
//   4. the operation is complete when every piece is back on the device, so a hook waiting for
//      it may queue the kernels that read the result at once.
// Copies take lanes of the device's copier from a pool; a copy that finds none starts in a later
// round. Host buffers are the copier's (pinned on a GPU: its copy engines reach pageable memory
// only through the driver's own bounce buffers), cached by size, so a step's operations reuse the
// blocks of the last one; they are allocated and freed on the launching thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/comm_engine.hpp"
#include "comm/communicator.hpp"
#include "core/buffer.hpp"

namespace mlptrain {

// Starts an operation on host memory (the communicator's MPI call).
using HostStarter = std::function<std::unique_ptr<PendingOperation>(const Operation&)>;

class HostStaging {
 public:
  // `device`: the allocator whose memory is staged (its copier moves the data); pieces of about
  // `chunk_bytes`.
  explicit HostStaging(Allocator& device, std::size_t chunk_bytes = default_chunk_bytes);

  static constexpr std::size_t default_chunk_bytes = std::size_t{4} << 20;

  // Whether a buffer of `operation` lies in device memory.
  bool stages(const Operation& operation) const;
  std::size_t chunk_bytes() const { return chunk_bytes_; }

  // The engine task that runs `operation` (on device memory) for rank `rank` of `ranks`, its MPI
  // calls on `channel` started by `start_host`. Its copies down are queued before this returns.
  std::unique_ptr<EngineTask> task(const Operation& operation, int rank, int ranks, IssueChannel channel,
                                   HostStarter start_host);

 private:
  friend class StagedTask;
  // A free lane of the copier, if any (either direction has its own pool of the same lanes).
  std::optional<int> take_lane(bool to_host);
  void give_lane(bool to_host, int lane);

  Allocator& device_;
  std::size_t chunk_bytes_;
  std::unique_ptr<AsyncCopier> copier_;
  std::mutex lanes_mutex_;  // lanes are taken on the launching thread and in the engine's rounds
  std::vector<int> free_to_host_, free_to_device_;
};

}  // namespace mlptrain
