// The communication operations, as one closed set: what the comm ledger counts, what predictions
// and reports name, and what communicators run. Names are the metrics file's keys (§2.4).
#pragma once

#include <array>
#include <string_view>

namespace mlptrain {

enum class CommOp : int {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  send,
  recv,
  reduce,   // to a root
  gather,   // to a root
  scatter,  // from a root
};
inline constexpr int comm_op_count = 10;
inline constexpr std::array<CommOp, comm_op_count> all_comm_ops = {
    CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::all_to_all, CommOp::broadcast,
    CommOp::send,       CommOp::recv,           CommOp::reduce,     CommOp::gather,     CommOp::scatter};
// The operations training uses: the keys of the metrics file and the run's summary (§2.4).
inline constexpr std::array<CommOp, 7> training_comm_ops = {
    CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::all_to_all,
    CommOp::broadcast,  CommOp::send,           CommOp::recv};

constexpr std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::reduce: return "reduce";
    case CommOp::gather: return "gather";
    case CommOp::scatter: return "scatter";
  }
  return "unknown";
}

}  // namespace mlptrain
