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

// nccl-tests' bus factor of an operation over `ranks` ranks: what each rank's link carries per
// byte of the operation's size (an all-reduce moves 2 (n-1)/n, a rooted or point-to-point
// operation its whole size, the others (n-1)/n).
constexpr double bus_factor(CommOp op, int ranks) {
  const double n = ranks;
  switch (op) {
    case CommOp::all_reduce: return 2 * (n - 1) / n;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_to_all:
    case CommOp::gather:
    case CommOp::scatter: return (n - 1) / n;
    case CommOp::broadcast:
    case CommOp::reduce:
    case CommOp::send:
    case CommOp::recv: return 1;
  }
  return 1;
}

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
