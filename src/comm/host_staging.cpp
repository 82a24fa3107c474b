// Host staging's pipeline of pieces (see host_staging.hpp).
#include "comm/host_staging.hpp"

#include <algorithm>
#include <stdexcept>

#include "comm/staging_plan.hpp"

namespace mlptrain {

namespace {

// Copies in flight at once, per direction: enough for 256 pieces' worth of a rank's operations
// (a GiB at the default chunk size), few enough that a GPU's events for them cost nothing.
constexpr int copier_lanes = 256;

}  // namespace

// One staged operation: its pieces, and where each stands.
class StagedTask final : public EngineTask {
 public:
  StagedTask(HostStaging& staging, const Operation& operation, int rank, int ranks, IssueChannel channel,
             HostStarter start_host)
      : EngineTask(channel), staging_(staging), start_host_(std::move(start_host)) {
    const StagingPlan plan(operation, rank, ranks, staging.chunk_bytes());
    Allocator& host_memory = staging.copier_->host_memory();
    // At least a byte: an empty message still names a buffer.
    host_ = host_memory.allocate(MemoryState::comm_buffers, std::max<std::size_t>(plan.host_bytes(), 1));
    source_ = static_cast<const std::byte*>(plan.source());
    destination_ = static_cast<std::byte*>(plan.destination());
    for (StagedPiece& planned : plan.pieces(host_.as<std::byte>())) {
      Piece piece{.operations = std::move(planned.operations)};
      for (const CopySpan& span : planned.down) piece.down.push_back({.span = span});
      for (const CopySpan& span : planned.up) piece.up.push_back({.span = span});
      pieces_.push_back(std::move(piece));
    }
    start_copies_down();
  }

  TaskProgress advance(bool may_issue) override {
    bool moved = start_copies_down();
    moved = finish(mark_, Way::down) || moved;
    for (Piece& piece : pieces_)
      for (Copy& copy : piece.down) moved = finish(copy, Way::down) || moved;
    // Issue in order: a piece's operations once its copies landed, after every earlier piece's.
    while (may_issue && issued_ < pieces_.size() && all_done(pieces_[issued_].down)) {
      Piece& piece = pieces_[issued_++];
      for (const Operation& operation : piece.operations) piece.in_flight.push_back(start_host_(operation));
      moved = true;
    }
    bool complete = mark_.done;
    for (std::size_t index = 0; index < issued_; ++index) {
      Piece& piece = pieces_[index];
      moved = communicate(piece) || moved;
      if (piece.communicated && mark_.done) {
        for (Copy& copy : piece.up) {
          moved = (!copy.started && start(copy, Way::up)) || moved;
          moved = finish(copy, Way::up) || moved;
        }
      }
      complete = complete && piece.communicated && all_done(piece.up);
    }
    complete = complete && issued_ == pieces_.size();
    return {.moved = moved, .issued_all = issued_ == pieces_.size(), .complete = complete};
  }

 private:
  enum class Way { down, up };  // device to host, host to device
  struct Copy {
    CopySpan span;
    int lane = -1;  // while in flight
    bool started = false;
    bool done = false;
  };
  struct Piece {
    std::vector<Copy> down;
    std::vector<Operation> operations;
    std::vector<Copy> up;
    std::vector<std::unique_ptr<PendingOperation>> in_flight;
    bool communicated = false;
  };

  static bool all_done(const std::vector<Copy>& copies) {
    return std::all_of(copies.begin(), copies.end(), [](const Copy& copy) { return copy.done; });
  }
  // Queues the copies down that find lanes, in order (a copy that finds none, and all after it,
  // wait for a later round).
  bool start_copies_down() {
    bool moved = false;
    if (!mark_.started && !start(mark_, Way::down)) return false;
    for (Piece& piece : pieces_)
      for (Copy& copy : piece.down) {
        if (copy.started) continue;
        if (!start(copy, Way::down)) return moved;
        moved = true;
      }
    return moved;
  }
  // Starts a copy if a lane is free; whether it started.
  bool start(Copy& copy, Way way) {
    const std::optional<int> lane = staging_.take_lane(way == Way::down);
    if (!lane) return false;
    std::byte* host = host_.as<std::byte>() + copy.span.host_offset;
    if (way == Way::down) {
      staging_.copier_->start_to_host(*lane, host, source_ + copy.span.device_offset, copy.span.bytes);
    } else {
      staging_.copier_->start_to_device(*lane, destination_ + copy.span.device_offset, host, copy.span.bytes);
    }
    copy.lane = *lane;
    copy.started = true;
    return true;
  }
  // Whether a copy in flight just finished (its lane then goes back to the pool).
  bool finish(Copy& copy, Way way) {
    if (!copy.started || copy.done) return false;
    AsyncCopier& copier = *staging_.copier_;
    if (!(way == Way::down ? copier.test_to_host(copy.lane) : copier.test_to_device(copy.lane))) return false;
    copy.done = true;
    staging_.give_lane(way == Way::down, copy.lane);
    copy.lane = -1;
    return true;
  }
  // Tests the piece's operations; whether the last of them just completed.
  static bool communicate(Piece& piece) {
    if (piece.communicated) return false;
    for (auto& operation : piece.in_flight)
      if (operation && operation->test()) operation.reset();
    piece.communicated = std::all_of(piece.in_flight.begin(), piece.in_flight.end(),
                                     [](const auto& operation) { return operation == nullptr; });
    return piece.communicated;
  }

  HostStaging& staging_;
  HostStarter start_host_;
  Buffer host_;  // the region the plan's host offsets point into
  const std::byte* source_ = nullptr;
  std::byte* destination_ = nullptr;
  std::vector<Piece> pieces_;
  // An empty copy down, queued before the task's others: done once the compute stream's work
  // queued before the operation is, which the copies up wait for (it may read the destination).
  Copy mark_;
  std::size_t issued_ = 0;  // pieces whose operations are started
};

HostStaging::HostStaging(Allocator& device, std::size_t chunk_bytes)
    : device_(device), chunk_bytes_(std::max<std::size_t>(chunk_bytes, 64)), copier_(device.make_async_copier(copier_lanes)) {
  if (!copier_) throw std::logic_error("host staging needs a device with background copies");
  for (int lane = copier_lanes - 1; lane >= 0; --lane) {
    free_to_host_.push_back(lane);
    free_to_device_.push_back(lane);
  }
}

bool HostStaging::stages(const Operation& operation) const {
  return (operation.send != nullptr && device_.is_device_memory(operation.send)) ||
         (operation.receive != nullptr && device_.is_device_memory(operation.receive));
}

std::unique_ptr<EngineTask> HostStaging::task(const Operation& operation, int rank, int ranks, IssueChannel channel,
                                              HostStarter start_host) {
  return std::make_unique<StagedTask>(*this, operation, rank, ranks, channel, std::move(start_host));
}

std::optional<int> HostStaging::take_lane(bool to_host) {
  const std::lock_guard lock(lanes_mutex_);
  std::vector<int>& free = to_host ? free_to_host_ : free_to_device_;
  if (free.empty()) return std::nullopt;
  const int lane = free.back();
  free.pop_back();
  return lane;
}

void HostStaging::give_lane(bool to_host, int lane) {
  const std::lock_guard lock(lanes_mutex_);
  (to_host ? free_to_host_ : free_to_device_).push_back(lane);
}

}  // namespace mlptrain
