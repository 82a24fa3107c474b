// In-place all-reduce through an MPI-3 shared-memory window, for a group whose ranks share one
// node. Each rank's buffer lives in the window, so no data is copied: posting an all-reduce only
// announces arrival. Once every rank has arrived, the range is summed chunk by chunk (in rank order,
// so every replica gets the same bits) and each sum is written into all ranks' ranges. Chunks are
// claimed by whichever ranks look first: the last to arrive, and any rank testing or waiting, so a
// rank that is ahead spends its idle time on the reduction instead of the one that is behind.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace mlptrain {

class SharedWindow {
 public:
  // Collective over `comm`, whose ranks must share a node: `bytes` per rank.
  SharedWindow(MPI_Comm comm, std::size_t bytes);
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  void* local_segment() const { return segments_[static_cast<std::size_t>(rank_)]; }
  std::size_t segment_bytes() const { return bytes_; }
  bool contains(const void* data, std::size_t bytes) const;

  // Starts the sum of `count` floats at `data` (inside this rank's segment) over the group. Every
  // rank must pass the same range of its own segment: the ranks lay out their buffers alike.
  std::unique_ptr<PendingOperation> start_sum(float* data, std::size_t count);

 private:
  // Operations in flight take slots in turn; a slot's words carry the operation's sequence number,
  // so a late look at a reused slot can never act on the wrong operation.
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                "the slots are shared between processes: their atomics must be lock-free");
  struct Slot {
    std::atomic<std::int32_t> arrivals;
    std::atomic<std::uint64_t> claims;     // sequence << 32 | chunks handed out so far
    std::atomic<std::uint32_t> finished;   // chunks summed
    std::atomic<std::uint64_t> completed;  // sequence number of the last completed operation
  };
  struct Sum {
    std::uint64_t sequence;
    std::size_t offset_bytes;
    std::size_t count;
  };
  class PendingSum;
  static constexpr std::size_t slot_count = 1024;
  static constexpr std::size_t chunk_floats = 16384;

  Slot& slot_of(std::uint64_t sequence) const { return slots_[sequence % slot_count]; }
  // Sums up to `most` unclaimed chunks of `sum`; true once the operation is complete.
  bool help(const Sum& sum, std::uint32_t most = ~std::uint32_t{0});
  void reduce_chunk(const Sum& sum, std::size_t chunk);

  MPI_Win data_window_ = MPI_WIN_NULL;
  MPI_Win control_window_ = MPI_WIN_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t bytes_ = 0;
  std::vector<char*> segments_;
  Slot* slots_ = nullptr;
  std::uint64_t sequence_ = 0;
};

// Whether every rank of `comm` runs on this node.
bool group_shares_node(MPI_Comm comm);

}  // namespace mlptrain
