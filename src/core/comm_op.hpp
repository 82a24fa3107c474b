// The communication operations, as one closed set: what the comm ledger counts, what predictions
// and reports name, and what communicators run. Names are the metrics file's keys (§2.4).
#pragma once

#include <array>
#include <string_view>

namespace mlptrain {

enum class CommOp : int { all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send, recv };
inline constexpr int comm_op_count = 7;
inline constexpr std::array<CommOp, comm_op_count> all_comm_ops = {
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
  }
  return "unknown";
}

}  // namespace mlptrain
