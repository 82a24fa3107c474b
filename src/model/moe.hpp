// A mixture-of-experts layer (DESIGN.md §2.1) as explicit forward and backward passes: a router
// W_r [E, hidden] whose softmax picks each token's top-k experts (ties to the lower index); the
// tokens' rows grouped by expert; each expert a Linear hidden -> hidden with GELU; the outputs
// combined, weighted by the router probabilities. Routing is defined on the global micro-batch
// (every data-parallel rank's tokens): capacity keeps the first ceil(f k T / E) assignments of
// each expert in global sample order, and the auxiliary load-balancing loss uses global fractions,
// so every layout routes alike. The layer reaches other ranks only through an ExpertExchange:
// per-expert statistics gathered over the data-parallel group, and rows sent to and from the
// ranks that hold the experts (the expert-parallel group). Routing decisions are made on the
// host from the router probabilities (a [tokens, E] matrix, copied from the layer's memory), and
// the tables the row moves need go back to that memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"

namespace mlptrain {

struct MoeSettings {
  double capacity_factor = 0;  // 0: dropless
  double aux_loss_coef = 0;
};

// How an MoE layer meets the rest of its global micro-batch and its experts.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // The data-parallel group (one global micro-batch) and the expert-parallel group inside it:
  // expert rank j of this rank's EP group is data rank (data_rank() - expert_rank() + j), and
  // holds experts [j E / X, (j + 1) E / X).
  virtual int data_ranks() const = 0;
  virtual int data_rank() const = 0;
  virtual int expert_ranks() const = 0;
  virtual int expert_rank() const = 0;
  // Every data rank's `count` values, in rank order: `all` holds data_ranks() x count.
  virtual void gather_statistics(const double* local, double* all, std::size_t count) = 0;
  // Rows to the EP group: `send` packed by destination rank, `receive` by source rank (elements
  // of `type` per rank given). Only called when there is more than one expert rank.
  virtual void exchange_rows(const void* send, const std::vector<std::size_t>& send_elements, void* receive,
                             const std::vector<std::size_t>& receive_elements, DataType type) = 0;
  // The tensor-parallel group, whose ranks hold the same tokens and split each expert-parallel
  // rank's experts among them (tensor rank t the t-th equal part): the probabilities' gradients
  // each computed from its own experts are summed over it.
  virtual int tensor_ranks() const { return 1; }
  virtual int tensor_rank() const { return 0; }
  virtual void sum_over_tensor_group(float* /*data*/, std::size_t /*count*/) {}
};

// One process: its micro-batch is the global one, and it holds every expert.
class SingleProcessExchange final : public ExpertExchange {
 public:
  int data_ranks() const override { return 1; }
  int data_rank() const override { return 0; }
  int expert_ranks() const override { return 1; }
  int expert_rank() const override { return 0; }
  void gather_statistics(const double* local, double* all, std::size_t count) override;
  void exchange_rows(const void* send, const std::vector<std::size_t>& send_elements, void* receive,
                     const std::vector<std::size_t>& receive_elements, DataType type) override;
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

// What one micro-batch's forward keeps for backward (charged as activations). Rows are of the
// param type; the router's probabilities fp32.
struct MoeActivations {
  Buffer probabilities;  // [rows, E]
  Buffer expert_input;   // [received, hidden], grouped by local expert
  Buffer expert_pre;     // [received, hidden]: x W_e^T + b_e
  Buffer returned;       // [kept, hidden]: the experts' outputs, packed order
  MoeRouting routing;
  MoeRoutingTables tables;
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(probabilities.bytes() + expert_input.bytes() + expert_pre.bytes() +
                                     returned.bytes() + tables.bytes());
  }
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

// Bytes one micro-batch of `rows` tokens keeps for backward in an MoE layer of which this rank
// holds `local_experts` experts in an expert-parallel group of `expert_ranks`, rows of
// `row_type`, when its routing is balanced (k rows per token reach the experts, a tensor slice
// its share of them; the actual figure follows the routing).
std::int64_t moe_activation_bytes(const LayerSpec& spec, int local_experts, int expert_ranks, std::int64_t rows,
                                  DataType row_type);

// Where an MoE layer's parameters are read and its gradients written (this rank's experts).
struct MoeParameters {
  void* router = nullptr;  // [E, hidden]
  void* router_grad = nullptr;
  void* weight = nullptr;  // [local experts, hidden, hidden]
  void* weight_grad = nullptr;
  void* bias = nullptr;  // [local experts, hidden]
  void* bias_grad = nullptr;
};

// An MoE layer's shape and places in the store (this rank's experts) and its passes.
class MoeLayer {
 public:
  MoeLayer(const ParameterStore& store, const LayerSpec& spec, const std::string& base_path,
           const MoeSettings& settings);

  const LayerSpec& spec() const { return spec_; }
  int local_experts() const { return local_experts_; }

  // Its parameters in a copy of its unit laid out as the store's (values and gradients from
  // the unit's first element): a gathered copy of sharded parameters, say.
  MoeParameters bind(void* unit_values, void* unit_grads) const;

  struct Pass {
    Kernels& kernels;
    Allocator& allocator;
    ExpertExchange& exchange;
    const MoeParameters* parameters = nullptr;  // null: the store's
  };
  // output [rows, hidden] from input [rows, hidden]; `statistics` (training) gathers routing
  // figures. Collective over the exchange's groups.
  void forward(const Pass& pass, const void* input, std::int64_t rows, void* output, MoeActivations& saved,
               MoeStatistics* statistics) const;
  // grad_input [rows, hidden] from grad_output, parameter gradients written (or added, when
  // `accumulate`); the auxiliary loss's gradient is that of its mean over `micro_batches`, times
  // `loss_scale` as the rest of the loss's gradient is.
  void backward(const Pass& pass, const void* input, const void* grad_output, std::int64_t rows, void* grad_input,
                MoeActivations& saved, bool accumulate, int micro_batches, float loss_scale = 1.0f) const;

 private:
  MoeRouting route(const Pass& pass, const float* probabilities, std::int64_t rows,
                   MoeStatistics* statistics) const;

  LayerSpec spec_;
  MoeSettings settings_;
  int first_expert_ = 0;
  int local_experts_ = 0;
  Precision precision_;  // values and rows of the param type, gradients of the reduce type
  // The tensors' places in the layer's unit (elements from its start), and the store's copy.
  std::size_t router_at_ = 0, weight_at_ = 0, bias_at_ = 0;
  MoeParameters store_;
};

}  // namespace mlptrain
