// One layer's step with the strategies' hooks around it: a Linear layer's (its products in the
// param type, or from fp8 operands whose amax the strategies agree on) or an MoE layer's forward,
// and its backward of a part. A layer computes on the rows its before-hooks give it (the rows it
// received, unless a strategy substitutes others), and its outputs have the rows they say (the
// same, unless a strategy splits them); they are allocated for those rows.
//
// A Linear layer's backward may run as two actions, for the zero-bubble schedules (Qi et al.,
// 2023): B, the input gradient, which the previous chunk waits for, and W, the weight and bias
// gradients, which nothing waits for and a schedule defers into its bubble. B keeps d loss /
// d product for W; W reads it with the layer's input, which stays alive from forward until then.
// The sums are the whole backward's (the same kernels over the same rows in the same order), so a
// split run gives the same gradients as a whole one. An MoE layer runs its whole backward in B:
// its experts' products and their gradients are one exchange.
//
// Under --fp8 the step keeps each dense layer's weight codes for the step (made at its first
// forward) and has a GELU take the amax of what it writes where the products of the operand want
// it (model/fp8_linear.hpp says which amax each product takes).
#pragma once

#include <cstdint>
#include <functional>

#include "chunk/chunk_layers.hpp"
#include "strategies/strategy_stack.hpp"

namespace mlptrain {

// What a layer's step uses besides the layer: the kernels, the memory, the strategies' hooks,
// and the activations' element type (the param type).
struct StepTools {
  Kernels& kernels;
  Allocator& allocator;
  StrategyStack& strategies;
  DataType activation_type;

  Buffer allocate_rows(MemoryState state, std::int64_t rows, std::int64_t columns) const {
    return allocator.allocate_elements(state, static_cast<std::size_t>(rows * columns), activation_type);
  }
};

// Which use of a layer a forward is.
struct ForwardPass {
  int micro_batch = 0;
  int micro_batches = 1;
  bool training = true;
  bool recomputing = false;  // in backward, for a layer whose activations forward dropped
};

class LayerStep {
 public:
  LayerStep(const StepTools& tools, const ChunkLayers& layers)
      : tools_(tools), layers_(layers), weight_scales_(layers.size()), weight_codes_(layers.size()) {}

  // Layer `local` forward from the input it receives, into its pre-activation and output
  // (allocated for its rows unless kept); the output goes to `scratch` when given (a recomputed
  // segment's last layer, whose output backward does not read).
  void forward(MicroBatchActivations& activations, std::size_t local, void* scratch, const ForwardPass& pass);

  // The start of layer `local`'s backward of `part` (its gradients written by the first
  // micro-batch, added by the later ones), before its hooks; `grad_input` is where its input
  // gradient goes (none for the model's first layer, and in W).
  BackwardStart backward_start(MicroBatchActivations& activations, std::size_t local, int micro_batch,
                               int micro_batches, BackwardPart part, std::optional<void*> grad_input) const;
  // Layer `local`'s backward of the start's part. Whole and B read `grad_output` (d loss / d
  // output of the layer) and use `workspace` for d loss / d pre of the layer's rows; B keeps d
  // loss / d product in the activations for W, which reads and frees it.
  void backward(MicroBatchActivations& activations, std::size_t local, BackwardStart& start, const void* grad_output,
                void* workspace, float loss_scale);

  // Whether layer `local`'s products share a tensorwise amax of its operands, which the kernels
  // that make them take where they can (--fp8 tensorwise, a dense layer): the GELU before it
  // (its input), its own GELU's backward or the loss (its d(pre)).
  bool takes_fp8_amax(std::size_t local) const;

  // Called with a layer's index before each forward of it reads its parameters (whose values may
  // still be arriving: an offloaded update runs into the next forward).
  void set_gate(std::function<void(int layer)> gate) { gate_ = std::move(gate); }
  // The routing statistics of the training forwards since the last call (MoE layers).
  MoeStatistics take_moe_statistics();

 private:
  // A layer's call for its hooks.
  LayerCall call(std::size_t local, int micro_batch, int micro_batches, bool training) const;
  // A Linear layer's products, in its param type or (--fp8) from fp8 operands whose amax the
  // strategies agree on as `call`'s.
  void forward_product(MicroBatchActivations& activations, std::size_t local, const LayerCall& call,
                       const LinearLayer& layer, const void* input, std::int64_t rows, void* pre, BiasPlace bias);
  void backward_products(MicroBatchActivations& activations, std::size_t local, const LayerCall& call,
                         const LinearLayer& layer, const void* input, const void* grad_pre, std::int64_t rows,
                         void* grad_input, bool accumulate, ProductGradients which);
  // The strategies' agreement on an fp8 operand's amax, for the layer's call.
  AmaxAgreement agreement(const LayerCall& call) const;
  // The step's scales of the layer's weight, taken at the step's first forward of it.
  const Fp8WeightScales& weight_scales(std::size_t local) const;
  // d loss / d product of a whole backward or B (with a Linear layer's bias sums where the part
  // computes them), and the buffers d loss / d pre took, held until the layer's backward ends: a
  // hook's transfer may still read them.
  struct ProductGradient {
    void* values = nullptr;
    Buffer split_grad_pre;
    Buffer unused_bias_sums;
  };
  ProductGradient product_gradient(MicroBatchActivations& activations, std::size_t local, const BackwardStart& start,
                                   const LinearLayer& layer, const void* grad_output, void* workspace);

  const StepTools tools_;
  const ChunkLayers& layers_;
  std::function<void(int layer)> gate_;
  MoeStatistics moe_statistics_;
  // Per local layer under --fp8: its weight's scales for the step, and its codes for the step
  // where the weight stays in the store (fp8_linear.hpp; one gathered for a use is coded there).
  std::vector<std::optional<Fp8WeightScales>> weight_scales_;
  std::vector<std::optional<Fp8WeightCodes>> weight_codes_;
  // The local layer whose input's amax the last forward's GELU took, for that layer's forward.
  std::optional<std::size_t> amax_taken_for_;
};

}  // namespace mlptrain
