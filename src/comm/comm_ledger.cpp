// Communication ledger bookkeeping (see comm_ledger.hpp).
#include "comm/comm_ledger.hpp"

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
