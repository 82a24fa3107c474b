// What an MoE layer's routing decides for one micro-batch (which token goes to which expert with
// what weight, who sends how many rows to whom), the same in the kernels' memory, and the routing
// figures a step reports. The routing itself is in moe_routing.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/buffer.hpp"

namespace mlptrain {

// The routing of one micro-batch, as backward needs it. "Packed" order is this rank's kept
// assignments sorted by expert, then token: the order rows leave for the experts.
struct MoeRouting {
  std::vector<std::int32_t> token;   // per packed assignment: the local token
  std::vector<std::int32_t> expert;  // ...its expert
  std::vector<float> weight;         // ...its router probability
  std::vector<std::size_t> send_rows;     // per expert rank: rows this rank sends
  std::vector<std::size_t> receive_rows;  // per expert rank: rows this rank's experts receive
  std::vector<std::int64_t> rows_per_local_expert;
  // Received rows come grouped by source rank; the experts need them grouped by expert.
  // grouping[i] is the received row at expert-grouped position i, ungrouping its inverse (both
  // empty with one expert rank, where the two orders coincide).
  std::vector<std::int32_t> grouping;
  std::vector<std::int32_t> ungrouping;
  // Each local token's packed assignments, ascending (the order combine adds them): token t's
  // are token_rows[token_row_begin[t]] up to token_rows[token_row_begin[t + 1] - 1].
  std::vector<std::int32_t> token_row_begin;
  std::vector<std::int32_t> token_rows;
  std::vector<double> fraction;  // f_e over the global micro-batch (no gradient)
  double tokens = 0;             // T: tokens of the global micro-batch

  std::int64_t kept() const { return static_cast<std::int64_t>(token.size()); }
  std::int64_t received() const;
};

// The routing's tables in the memory the kernels read (int32 rows, float weights).
struct MoeRoutingTables {
  Buffer token;       // MoeRouting::token
  Buffer weight;      // MoeRouting::weight
  Buffer grouping;    // MoeRouting::grouping (empty with one expert rank)
  Buffer ungrouping;  // MoeRouting::ungrouping
  std::size_t bytes() const { return token.bytes() + weight.bytes() + grouping.bytes() + ungrouping.bytes(); }
};

// Routing statistics of training forwards, summed over a step's micro-batches. Loads, the
// auxiliary loss and dropped assignments are global (equal on every data-parallel rank); the
// all-to-all bytes are this rank's, as the routing counts predict them (forward and backward).
struct MoeStatistics {
  std::map<int, std::vector<double>> expert_load;  // per layer: assignments per expert
  double aux_loss = 0;                             // summed over micro-batches and layers
  double dropped = 0;
  double all_to_all_bytes = 0;

  void clear() { *this = MoeStatistics{}; }
  // Adds another's (other layers': a rank's model chunks hold different MoE layers).
  void add(MoeStatistics&& other) {
    expert_load.merge(other.expert_load);
    aux_loss += other.aux_loss;
    dropped += other.dropped;
    all_to_all_bytes += other.all_to_all_bytes;
  }
};

}  // namespace mlptrain
