// A prediction of one rank's memory by state and communication per step (DESIGN.md §2.4): what
// the cost model's pure functions give, and what the summary sets beside the ledgers.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/comm_op.hpp"
#include "core/memory_ledger.hpp"

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
inline constexpr std::array<MemoryState, 4> placed_states = {
    MemoryState::params, MemoryState::grads, MemoryState::optimizer, MemoryState::activations};

struct Prediction {
  StatePrediction params;
  StatePrediction grads;
  StatePrediction optimizer;
  StatePrediction activations;
  std::array<std::int64_t, comm_op_count> comm_bytes_per_step{};

  std::int64_t& comm(CommOp op) { return comm_bytes_per_step[static_cast<int>(op)]; }
  std::int64_t comm(CommOp op) const { return comm_bytes_per_step[static_cast<int>(op)]; }
  // One of placed_states.
  StatePrediction& state(MemoryState state);
  const StatePrediction& state(MemoryState state) const;
  // A state that replicated becomes sharded (each rank holds its own part); other modes stay.
  static void shard(StatePrediction& state) {
    if (state.mode == PlacementMode::replicated) state.mode = PlacementMode::sharded;
  }
};

}  // namespace mlptrain
