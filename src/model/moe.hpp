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
#include <string>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/moe_routing.hpp"
#include "model/parameter_store.hpp"

namespace mlptrain {

struct MoeRowMoves;  // moe_rows.hpp

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

// Bytes one micro-batch of `rows` tokens keeps for backward in an MoE layer of which this rank
// holds `local_experts` experts in an expert-parallel group of `expert_ranks`, rows of
// `row_type`, when its routing is balanced (k rows per token reach the experts, a tensor slice
// its share of them; the actual figure follows the routing), or where the rank holds some of
// the layer's experts and their rows are `expert_share` times the balanced share (a plan of the
// busiest rank).
std::int64_t moe_activation_bytes(const LayerSpec& spec, int local_experts, int expert_ranks, std::int64_t rows,
                                  DataType row_type, double expert_share = 1.0);

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
  // A backward's steps (moe.cpp): through the combine, the experts, through the router.
  struct CombineGradients {
    Buffer output_grads;       // [received, hidden], at the experts
    Buffer probability_grads;  // [kept], fp32
  };
  CombineGradients through_combine(const MoeRowMoves& moves, const void* grad_output, MoeActivations& saved) const;
  Buffer experts_backward(const MoeRowMoves& moves, const MoeParameters& parameters, Buffer output_grads,
                          MoeActivations& saved, bool accumulate) const;
  Buffer through_router(const MoeRowMoves& moves, const Buffer& probability_grads, const MoeActivations& saved,
                        std::int64_t rows, int micro_batches, float loss_scale) const;

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
