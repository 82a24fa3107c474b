// Communication ledger bookkeeping (see comm_ledger.hpp).
#include "comm/comm_ledger.hpp"

#include <algorithm>

#include "core/timer.hpp"

namespace mlptrain {

template <typename Update>
void CommLedger::update(std::string_view group, Update&& change) {
  change(step_);
  change(run_);
  auto found = by_group_.find(group);
  if (found == by_group_.end()) found = by_group_.emplace(std::string(group), CommTotals{}).first;
  change(found->second);
}

std::uint64_t CommLedger::record_posted(CommOp op, std::string_view group, std::int64_t bytes, DataType type) {
  const int index = static_cast<int>(op);
  update(group, [&](CommTotals& totals) {
    totals.bytes[index] += bytes;
    totals.calls[index] += 1;
  });
  const std::lock_guard lock(recent_mutex_);
  const std::uint64_t sequence = posted_++;
  RecentOperation& slot = recent_[sequence % recent_count];
  slot.sequence = sequence;
  slot.op = op;
  slot.group.assign(group);  // short names: no allocation once the slot has held one
  slot.bytes = bytes;
  slot.type = type;
  slot.completed = false;
  return sequence;
}

void CommLedger::begin_step() {
  step_ = {};
  step_start_ms_ = now_ms();
  step_spans_.clear();
  step_wait_ms_ = 0;
}

CommWallTime CommLedger::step_wall_time() const {
  // The union of the spans, each cut at the step's start (an operation started in the step
  // before counts from this one's start).
  std::vector<std::pair<double, double>> spans = step_spans_;
  std::sort(spans.begin(), spans.end());
  double busy = 0, covered_until = step_start_ms_;
  for (const auto& [start, end] : spans) {
    const double from = std::max(start, covered_until);
    if (end > from) busy += end - from;
    covered_until = std::max(covered_until, end);
  }
  return {.busy_ms = busy, .wait_ms = step_wait_ms_};
}

std::vector<RecentOperation> CommLedger::recent() const {
  const std::lock_guard lock(recent_mutex_);
  std::vector<RecentOperation> operations;
  const std::uint64_t first = posted_ > recent_count ? posted_ - recent_count : 0;
  for (std::uint64_t sequence = first; sequence < posted_; ++sequence)
    operations.push_back(recent_[sequence % recent_count]);
  return operations;
}

void CommLedger::record_completed(std::uint64_t sequence, CommOp op, std::string_view group, std::int64_t bytes,
                                  DataType type, double start_ms, double end_ms) {
  {
    const std::lock_guard lock(recent_mutex_);
    RecentOperation& slot = recent_[sequence % recent_count];
    if (slot.sequence == sequence) slot.completed = true;
  }
  const int index = static_cast<int>(op);
  update(group, [&](CommTotals& totals) { totals.milliseconds[index] += end_ms - start_ms; });
  step_spans_.emplace_back(start_ms, end_ms);
  if (trace_ != nullptr) {
    const bool point_to_point = op == CommOp::send || op == CommOp::recv;
    trace_->record({.name = std::string(comm_op_name(op)),
                    .track = point_to_point ? TraceTrack::transfers : TraceTrack::collectives,
                    .start_ms = start_ms,
                    .end_ms = end_ms,
                    .bytes = bytes,
                    .group = std::string(group),
                    .type = type});
  }
}

}  // namespace mlptrain
