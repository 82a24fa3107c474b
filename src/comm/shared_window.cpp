// Shared-memory in-place collectives (see shared_window.hpp).
#include "comm/shared_window.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>

#include "core/elements.hpp"

namespace mlptrain {

namespace {

class Done final : public PendingOperation {
 public:
  bool test() override { return true; }
  void wait() override {}
};

std::uint32_t chunk_count(std::size_t count, std::size_t chunk_elements) {
  return static_cast<std::uint32_t>((count + chunk_elements - 1) / chunk_elements);
}

// An operation's mark in a slot's claims word: the low 32 bits of its sequence number (slots are
// reused every slot_count operations, so these tell operations of one slot apart).
std::uint64_t tag(std::uint64_t sequence) { return sequence << 32; }

}  // namespace

class SharedWindow::Pending final : public PendingOperation {
 public:
  Pending(SharedWindow& window, Task task) : window_(window), task_(task) {}
  bool test() override { return window_.help(task_); }
  void wait() override {
    // Yield while waiting: ranks may share cores. And keep MPI progressing: a rank spinning here
    // may hold up a transfer of its own (a pipeline send that moves only inside MPI calls) that
    // another rank of this operation waits for before it can arrive.
    int message_waiting = 0;
    while (!window_.help(task_)) {
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, window_.comm_, &message_waiting, MPI_STATUS_IGNORE);
      sched_yield();
    }
  }

 private:
  SharedWindow& window_;
  Task task_;
};

bool group_shares_node(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0, size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_size(comm, &size);
  MPI_Comm_free(&node);
  return node_size == size;
}

SharedWindow::SharedWindow(MPI_Comm comm, std::size_t bytes) : comm_(comm), bytes_(bytes) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  // Whole pages per rank, so no two ranks' data share a cache line or a page. The slots live in
  // front of rank 0's data, in the same window: each window allocation is a slow collective when
  // ranks outnumber cores. Rank 0 constructs them before anyone uses them (the barrier orders that).
  constexpr std::size_t page = 4096;
  const auto whole_pages = [page](std::size_t bytes) { return std::max<std::size_t>((bytes + page - 1) / page * page, page); };
  const std::size_t padded = whole_pages(bytes);
  const std::size_t control_bytes = whole_pages(slot_count * sizeof(Slot));
  void* base = nullptr;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(padded + (rank_ == 0 ? control_bytes : 0)), 1, MPI_INFO_NULL, comm,
                          &base, &window_);
  segments_.resize(static_cast<std::size_t>(size_));
  posted_.resize(slot_count);
  for (int rank = 0; rank < size_; ++rank) {
    MPI_Aint size = 0;
    int unit = 0;
    void* segment = nullptr;
    MPI_Win_shared_query(window_, rank, &size, &unit, &segment);
    char* start = static_cast<char*>(segment);
    if (rank == 0) {
      slots_ = reinterpret_cast<Slot*>(start);
      start += control_bytes;
    }
    segments_[static_cast<std::size_t>(rank)] = start;
  }
  if (rank_ == 0)
    for (std::size_t index = 0; index < slot_count; ++index)
      new (&slots_[index]) Slot{{0}, {0}, {0}, {0}};
  MPI_Barrier(comm);
}

SharedWindow::~SharedWindow() {
  // Freeing a window waits for every rank: not while unwinding from an error that other ranks may
  // not share (the process is about to end, and MPI_Finalize or MPI_Abort reclaims it).
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || std::uncaught_exceptions() > 0) return;
  if (window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
}

bool SharedWindow::contains(const void* data, std::size_t bytes) const {
  const char* begin = segments_[static_cast<std::size_t>(rank_)];
  const char* pointer = static_cast<const char*>(data);
  return pointer >= begin && pointer + bytes <= begin + bytes_;
}

std::unique_ptr<PendingOperation> SharedWindow::start(Kind kind, void* data, std::size_t count, DataType type) {
  const std::uint64_t sequence = ++sequence_;
  if (count == 0 || size_ == 1) return std::make_unique<Done>();
  const Task task{kind, sequence,
                  static_cast<std::size_t>(static_cast<char*>(data) - segments_[static_cast<std::size_t>(rank_)]),
                  count, type};
  Slot& slot = slot_of(sequence);
  Task& previous = posted_[sequence % slot_count];
  // The slot's previous operation must be over before the slot is reused (only with more than
  // slot_count operations in flight on this rank): help finish it, as every rank waiting does.
  while (sequence > slot_count && !help(previous)) sched_yield();
  previous = task;
  // acq_rel: the last arrival acquires every earlier arrival's writes to its own range.
  if (slot.arrivals.fetch_add(1, std::memory_order_acq_rel) == size_ - 1) {
    slot.finished.store(0, std::memory_order_relaxed);
    slot.claims.store(tag(sequence), std::memory_order_release);  // open the chunks
    help(task, (chunk_count(count, chunk_elements) + size_ - 1) / size_);  // a fair share
  }
  return std::make_unique<Pending>(*this, task);
}

bool SharedWindow::help(const Task& task, std::uint32_t most) {
  Slot& slot = slot_of(task.sequence);
  if (slot.completed.load(std::memory_order_acquire) >= task.sequence) return true;
  const std::uint32_t chunks = chunk_count(task.count, chunk_elements);
  std::uint64_t claims = slot.claims.load(std::memory_order_acquire);
  for (std::uint32_t done = 0;
       done < most && (claims & ~0xffffffffull) == tag(task.sequence) &&
       (claims & 0xffffffffu) < chunks;) {
    if (!slot.claims.compare_exchange_weak(claims, claims + 1, std::memory_order_acq_rel))
      continue;
    do_chunk(task, static_cast<std::size_t>(claims & 0xffffffffu));
    ++done;
    if (slot.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      slot.arrivals.store(0, std::memory_order_relaxed);
      slot.completed.store(task.sequence, std::memory_order_release);
      return true;
    }
    claims = slot.claims.load(std::memory_order_acquire);
  }
  return slot.completed.load(std::memory_order_acquire) >= task.sequence;
}

void SharedWindow::do_chunk(const Task& task, std::size_t chunk) {
  const std::size_t first = chunk * chunk_elements;
  const std::size_t end = std::min(task.count, first + chunk_elements);
  if (task.kind == Kind::sum) {
    sum_piece(task, first, end, -1);
    return;
  }
  // The block kinds: split the chunk where blocks change owner.
  const std::size_t block = task.count / static_cast<std::size_t>(size_);
  for (std::size_t at = first; at < end;) {
    const int owner = static_cast<int>(at / block);
    const std::size_t piece_end = std::min(end, (static_cast<std::size_t>(owner) + 1) * block);
    if (task.kind == Kind::sum_scatter) {
      sum_piece(task, at, piece_end, owner);
    } else {
      const std::size_t element = size_of(task.type);
      const void* source = advance(range_of(owner, task), at, task.type);
      for (int rank = 0; rank < size_; ++rank)
        if (rank != owner) std::memcpy(advance(range_of(rank, task), at, task.type), source, (piece_end - at) * element);
    }
    at = piece_end;
  }
}

void SharedWindow::sum_piece(const Task& task, std::size_t first, std::size_t end, int owner) {
  with_element(task.type, [&](auto element) {
    using E = decltype(element);
    // Sub-pieces small enough to stay in the first-level cache between the sum and the write-back.
    constexpr std::size_t piece = 2048;
    float total[piece];
    const auto values = [&](int rank) { return elements<E>(range_of(rank, task)); };
    for (std::size_t at = first; at < end; at += piece) {
      const std::size_t length = std::min(piece, end - at);
      const auto* __restrict first_part = values(0) + at;
      for (std::size_t i = 0; i < length; ++i) total[i] = E::load(first_part[i]);
      for (int rank = 1; rank < size_; ++rank) {
        const auto* __restrict part = values(rank) + at;
        for (std::size_t i = 0; i < length; ++i) total[i] += E::load(part[i]);
      }
      for (int rank = owner >= 0 ? owner : 0; rank < (owner >= 0 ? owner + 1 : size_); ++rank) {
        auto* __restrict out = values(rank) + at;
        for (std::size_t i = 0; i < length; ++i) out[i] = E::store(total[i]);
      }
    }
  });
}

}  // namespace mlptrain
