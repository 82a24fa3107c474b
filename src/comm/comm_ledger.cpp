// Communication ledger bookkeeping (see comm_ledger.hpp).
#include "comm/comm_ledger.hpp"

namespace mlptrain {

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
  }
  return "unknown";
}

void CommTotals::add(CommOp op, std::int64_t byte_count, double ms) {
  const int index = static_cast<int>(op);
  bytes[index] += byte_count;
  milliseconds[index] += ms;
  calls[index] += 1;
}

void CommLedger::record(CommOp op, std::string_view group, std::int64_t bytes, double ms) {
  step_.add(op, bytes, ms);
  run_.add(op, bytes, ms);
  auto found = by_group_.find(group);
  if (found == by_group_.end()) found = by_group_.emplace(std::string(group), CommTotals{}).first;
  found->second.add(op, bytes, ms);
}

}  // namespace mlptrain
