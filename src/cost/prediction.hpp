// A prediction of one rank's memory by state and communication per step (DESIGN.md §2.4): what
// the cost model's pure functions give, and what the summary sets beside the ledgers.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/comm_op.hpp"
#include "core/memory_ledger.hpp"
#include "core/process_grid.hpp"

namespace mlptrain {

// How a state is held across the ranks: replicated on each, sharded, sharded and gathered for
// use (parameters under ZeRO stage 3), materialized again when needed (recomputed activations),
// or offloaded to host memory.
enum class PlacementMode { replicated, sharded, sharded_gathered, materialized, offloaded };

// The mode's code in reports and the metrics file: R, S, SG, M, Off.
constexpr std::string_view mode_code(PlacementMode mode) {
  switch (mode) {
    case PlacementMode::replicated: return "R";
    case PlacementMode::sharded: return "S";
    case PlacementMode::sharded_gathered: return "SG";
    case PlacementMode::materialized: return "M";
    case PlacementMode::offloaded: return "Off";
  }
  return "?";
}

struct StatePrediction {
  PlacementMode mode = PlacementMode::replicated;
  std::int64_t bytes = 0;
};

// The states a prediction places, in report order.
inline constexpr std::array<MemoryState, 5> placed_states = {MemoryState::params, MemoryState::grads,
                                                             MemoryState::optimizer, MemoryState::activations,
                                                             MemoryState::comm_buffers};

inline constexpr int group_kind_count = static_cast<int>(std::size(all_group_kinds));

struct Prediction {
  StatePrediction params;
  StatePrediction grads;
  StatePrediction optimizer;
  StatePrediction activations;
  // What collectives and pipeline transfers work on: fixed pools and in-flight boundary tensors.
  StatePrediction comm_buffers;
  // Bytes per step in nccl-tests' sizes, by the group an operation runs over (which decides the
  // links it crosses) and by operation.
  std::array<std::array<std::int64_t, comm_op_count>, group_kind_count> comm_by_group{};

  void add_comm(GroupKind group, CommOp op, std::int64_t bytes) {
    comm_by_group[static_cast<int>(group)][static_cast<int>(op)] += bytes;
  }
  void set_comm(GroupKind group, CommOp op, std::int64_t bytes) {
    comm_by_group[static_cast<int>(group)][static_cast<int>(op)] = bytes;
  }
  std::int64_t comm(GroupKind group, CommOp op) const {
    return comm_by_group[static_cast<int>(group)][static_cast<int>(op)];
  }
  // Over every group.
  std::int64_t comm(CommOp op) const;
  // One of placed_states.
  StatePrediction& state(MemoryState state);
  const StatePrediction& state(MemoryState state) const;
  // A state that replicated becomes sharded (each rank holds its own part); other modes stay.
  static void shard(StatePrediction& state) {
    if (state.mode == PlacementMode::replicated) state.mode = PlacementMode::sharded;
  }
};

}  // namespace mlptrain
