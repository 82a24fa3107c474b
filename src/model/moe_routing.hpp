// An MoE layer's routing of one micro-batch: each rank's top-k choices, the per-expert counts and
// probability sums of the global micro-batch gathered over the data-parallel group, capacity and
// dropping in global sample order, the auxiliary loss, and who sends how many rows to whom; what
// it decides (which token goes to which expert with what weight), the same in the kernels'
// memory, and the routing figures a step reports.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/buffer.hpp"
#include "model/expert_exchange.hpp"
#include "model/model_spec.hpp"

namespace mlptrain {

struct MoeSettings {
  double capacity_factor = 0;  // 0: dropless
  double aux_loss_coef = 0;
};

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

// The experts of an MoE layer this rank holds: [first, first + count).
struct ExpertSlice {
  int first = 0;
  int count = 0;
};

// Routes the `rows` tokens of this rank's part of the micro-batch from their router
// probabilities (a [rows, E] matrix in host memory) for the layer `spec`, this rank holding
// `held` of its experts; rows of `row_bytes` bytes each. Collective over the exchange's
// data-parallel group. `statistics` (training) gathers the routing's figures.
MoeRouting route_tokens(const LayerSpec& spec, const MoeSettings& settings, ExpertSlice held, ExpertExchange& exchange,
                        std::size_t row_bytes, const float* probabilities, std::int64_t rows, MoeStatistics* statistics);

}  // namespace mlptrain
