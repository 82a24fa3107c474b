// A fault on purpose, to test what a run does when its ranks diverge: one rank leaves out one
// operation of one group (the N-th of its kind and element type there), as a bug would, and the
// others wait in it until the hang watchdog reports where the ranks parted. The programs read it
// from the environment (MLPTRAIN_FAULT=RANK:GROUP:OP:TYPE:N, e.g. 1:world:all_reduce:fp64:3) and
// hand it to the communicator factory; nothing in training knows it exists.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.hpp"

namespace mlptrain {

struct FaultPlan {
  int world_rank = 0;     // the rank that skips
  std::string group;      // the group's name (world, dp, tp, ...)
  CommOp op = CommOp::all_reduce;
  DataType type = DataType::float32;
  int occurrence = 1;     // which of its operations of that kind and type (1-based)
};

// The plan MLPTRAIN_FAULT describes, if set; a malformed value is a UsageError naming it.
std::optional<FaultPlan> fault_plan_from_environment();

// `inner`, skipping the planned operation (on the planned rank's planned group; else unchanged).
std::unique_ptr<Communicator> with_fault(std::unique_ptr<Communicator> inner, int world_rank,
                                         const FaultPlan& plan);

}  // namespace mlptrain
