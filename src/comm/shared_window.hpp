// In-place collectives through an MPI-3 shared-memory window, for a group whose ranks share one
// node. Each rank's buffer lives in the window, so no data is copied on the way in or out: posting
// an operation only announces arrival. Once every rank has arrived, the range is processed chunk
// by chunk, each chunk claimed by whichever rank looks first (the last to arrive takes a fair
// share; a rank that is ahead takes the rest while it tests or waits, so it spends idle time on
// the work instead of the rank that is behind), and nobody has to call into MPI for it to progress.
//   sum:         every rank's range becomes the element-wise sum (summed in rank order in fp32 and
//                rounded once for 16-bit floats, so every replica holds the same bits): an
//                all-reduce.
//   sum_scatter: the range is split in `size` equal blocks; block b of rank b becomes the sum of
//                every rank's block b (a reduce-scatter); other blocks are left as they were
//                (callers may not rely on that: other backends leave them undefined).
//   gather:      block b of rank b is copied into block b of every rank (an all-gather).
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
  enum class Kind { sum, sum_scatter, gather };

  // Collective over `comm`, whose ranks must share a node: `bytes` per rank.
  SharedWindow(MPI_Comm comm, std::size_t bytes);
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  void* local_segment() const { return segments_[static_cast<std::size_t>(rank_)]; }
  std::size_t segment_bytes() const { return bytes_; }
  bool contains(const void* data, std::size_t bytes) const;

  // Starts an operation on the `count` elements of `type` (fp32, bf16, fp16) at `data` (inside this
  // rank's segment; for the block kinds, count is the whole range, a multiple of the group size).
  // Every rank must pass the same range of its own segment: the ranks lay out their buffers alike.
  std::unique_ptr<PendingOperation> start(Kind kind, void* data, std::size_t count, DataType type);

 private:
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
                "the slots are shared between processes: their atomics must be lock-free");
  // Operations in flight take slots in turn; a slot's words carry the operation's sequence number,
  // so a late look at a reused slot can never act on the wrong operation.
  struct Slot {
    std::atomic<std::int32_t> arrivals;
    std::atomic<std::uint64_t> claims;     // low 32 bits of the sequence << 32 | chunks handed out
    std::atomic<std::uint32_t> finished;   // chunks done
    std::atomic<std::uint64_t> completed;  // sequence number of the last completed operation
  };
  struct Task {
    Kind kind;
    std::uint64_t sequence;
    std::size_t offset_bytes;
    std::size_t count;
    DataType type;
  };
  class Pending;
  static constexpr std::size_t slot_count = 1024;
  static constexpr std::size_t chunk_elements = 16384;

  Slot& slot_of(std::uint64_t sequence) const { return slots_[sequence % slot_count]; }
  void* range_of(int rank, const Task& task) const { return segments_[static_cast<std::size_t>(rank)] + task.offset_bytes; }
  // Does up to `most` unclaimed chunks of `task`; true once the operation is complete.
  bool help(const Task& task, std::uint32_t most = ~std::uint32_t{0});
  void do_chunk(const Task& task, std::size_t chunk);
  // Elements [first, end) of the task, all inside the block of `owner`.
  void sum_piece(const Task& task, std::size_t first, std::size_t end, int owner);

  MPI_Comm comm_ = MPI_COMM_NULL;  // the group's (not owned)
  MPI_Win window_ = MPI_WIN_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t bytes_ = 0;
  std::vector<char*> segments_;
  Slot* slots_ = nullptr;
  std::uint64_t sequence_ = 0;
  std::vector<Task> posted_;  // this rank's operation of every slot, to help finish before reuse
};

// Whether every rank of `comm` runs on this node.
bool group_shares_node(MPI_Comm comm);

}  // namespace mlptrain
