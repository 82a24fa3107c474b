// Runs this rank's layers forward and backward for one micro-batch, keeping the activations that
// backward needs (model/recompute_plan.hpp says which) and calling the strategies' hooks at the
// fixed points around each layer. A layer computes on the rows its before-hook gives it (the
// rows it received, unless a strategy substitutes others), and its outputs have the rows the
// hook says (the same, unless a strategy splits them): they are allocated for those rows, the
// next layer receives them, and backward and recomputation use the same counts.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/linear.hpp"
#include "model/loss.hpp"
#include "model/moe.hpp"
#include "model/recompute_plan.hpp"
#include "model/micro_batch.hpp"
#include "train/strategy_stack.hpp"

namespace mlptrain {

// Runs one model chunk (a contiguous range of layers; a rank holding several has one runner each).
class ModelRunner {
 public:
  ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
              const std::vector<LayerSpec>& specs, LayerRange chunk, StrategyStack& strategies,
              const MoeSettings& moe = {}, bool recompute = false);

  bool computes_loss() const { return last_layer_ == layer_count_; }
  bool reads_inputs() const { return first_layer_ == 0; }
  // Features per row of the local input and output (this rank's slices), and their type.
  std::int64_t input_width() const { return layers_.front().spec.in_features; }
  std::int64_t output_width() const { return layers_.back().spec.out_features; }
  DataType activation_type() const { return activation_type_; }
  // The last local layer's output of a micro-batch whose forward is done, and its rows.
  void* output(MicroBatchActivations& activations) const {
    return layer_output(activations, layers_.size() - 1);
  }
  static std::int64_t output_rows(const MicroBatchActivations& activations) {
    return activations.output_rows.empty() ? activations.rows : activations.output_rows.back();
  }
  const std::vector<LinearLayer>& layers() const { return layers_; }
  // The routing statistics of the training forwards since the last call (MoE layers).
  MoeStatistics take_moe_statistics();
  // The most activation memory a training micro-batch's MoE layers kept so far (0: none ran).
  std::int64_t largest_moe_bytes() const { return largest_moe_bytes_; }

  // Buffers for a micro-batch of `rows` samples: the input, and targets or labels when this rank
  // computes the loss.
  MicroBatchActivations prepare(std::int64_t rows, LossKind loss_kind);

  // Forward through the local layers. Where the loss is computed (in fp32, from the widened
  // output), returns its sums and (when training) fills loss_grad with the gradient of the mean
  // over `loss_samples` samples times `loss_scale`, rounded to the param type.
  LossSums forward(MicroBatchActivations& activations, int micro_batch, int micro_batches,
                   bool training, LossKind loss_kind, std::int64_t loss_samples, float loss_scale = 1.0f);
  // Backward through the local layers, accumulating parameter gradients over micro-batches
  // (the first micro-batch overwrites), from the loss gradient where the loss is computed and
  // else from output_grad (both scaled by `loss_scale`, as the MoE layers' auxiliary loss is
  // here). Frees the micro-batch's activations; input_grad holds d loss / d input afterwards
  // unless the local layers start the model.
  // Split (a zero-bubble schedule's B and W, train/model_backward.cpp): `input` computes the
  // input gradients and keeps every activation and each Linear layer's d loss / d product (an
  // MoE layer runs its whole backward here: its experts' products and their gradients are one
  // exchange); `weight` then computes the Linear layers' weight and bias gradients and frees the
  // micro-batch's activations. Each layer's hooks see the event's part.
  void backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale = 1.0f,
                BackwardPart part = BackwardPart::whole);

  // Called with a layer's index before each forward of it reads its parameters (whose values
  // may still be arriving: an offloaded update runs into the next forward).
  void set_forward_gate(std::function<void(int layer)> gate) { forward_gate_ = std::move(gate); }
  const RecomputePlan& recompute_plan() const { return plan_; }

 private:
  void* layer_output(MicroBatchActivations& activations, std::size_t local) const;
  // The loss of the last layer's output, its gradient into loss_grad when training.
  LossSums loss(MicroBatchActivations& activations, bool training, LossKind loss_kind, std::int64_t loss_samples,
                float loss_scale);
  Buffer allocate_rows(MemoryState state, std::int64_t rows, std::int64_t columns) {
    return allocator_.allocate_elements(state, static_cast<std::size_t>(rows * columns), activation_type_);
  }
  // Runs layer `local` forward from the input it receives (the micro-batch's, or the previous
  // layer's output) with the strategies' forward hooks, into its pre-activation and output,
  // allocated for the rows the layer computes on unless kept; the output goes to `scratch` when
  // given (a recomputed segment's last layer, whose output backward does not read).
  // Recomputing: in backward, for a layer whose activations forward did not keep.
  struct ForwardPass {
    int micro_batch = 0;
    int micro_batches = 1;
    bool training = true;
    bool recomputing = false;
  };
  void layer_forward(MicroBatchActivations& activations, std::size_t local, void* scratch, const ForwardPass& pass);
  // The rows layer `local` receives.
  std::int64_t input_rows(const MicroBatchActivations& activations, std::size_t local) const {
    return local == 0 ? activations.rows : activations.output_rows[local - 1];
  }
  // The layer's event before its hooks (its unit in the store), and its tensors placed from
  // where the before-hooks left the unit.
  LayerEvent layer_event(std::size_t local) const;
  void place_parameters(std::size_t local, LayerEvent& event, LinearLayer& view,
                        MoeParameters& moe_parameters) const;
  // The backward's before-hooks, then the layer's tensors placed from where they left its unit.
  LinearLayer begin_backward(std::size_t local, BackwardEvent& event, MoeParameters& moe_parameters);
  // Backward of layer `local` (its event prepared) from grad_output
  // into event.layer_grad_input; `grad_pre` is workspace for d loss / d pre of layer_rows rows.
  void layer_backward(MicroBatchActivations& activations, std::size_t local, BackwardEvent& event,
                      void* grad_pre, int micro_batches, float loss_scale);
  // A Linear layer's B and W (model_backward.cpp).
  void layer_backward_input(MicroBatchActivations& activations, std::size_t local, BackwardEvent& event);
  void layer_backward_weight(MicroBatchActivations& activations, std::size_t local, int micro_batch, int micro_batches);
  // The event of layer `local`'s backward, its input and gradients placed.
  BackwardEvent backward_event(const MicroBatchActivations& activations, std::size_t local, int micro_batch,
                            int micro_batches, const void* grad_output, void* grad_input) const;
  // The input a layer read in forward: the micro-batch's, or the previous layer's output.
  const void* layer_input(MicroBatchActivations& activations, std::size_t local) const {
    return local == 0 ? activations.input.as<void>() : layer_output(activations, local - 1);
  }
  // Backward's walk over the layers for `part` (whole or input).
  void backward_pass(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                     BackwardPart part);
  // Recomputes the activations of the local layers [first, last] that forward dropped; the last
  // layer's output is not needed again and goes to `scratch`.
  void recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last,
                         void* scratch, int micro_batch, int micro_batches);

  Kernels& kernels_;
  Allocator& allocator_;
  StrategyStack& strategies_;
  const DataType activation_type_;
  std::function<void(int layer)> forward_gate_;
  // Per local layer: a Linear layer's views, or an MoE layer's shape (its parameters are in
  // moe_layers_).
  std::vector<LinearLayer> layers_;
  std::vector<std::optional<MoeLayer>> moe_layers_;
  // Per local layer: its unit in the store, and a Linear layer's weight and bias in it.
  struct StoreUnit {
    void* values = nullptr;
    void* grads = nullptr;
    std::size_t weight_at = 0;
    std::size_t bias_at = 0;
  };
  std::vector<StoreUnit> units_;
  MoeStatistics moe_statistics_;
  std::int64_t largest_moe_bytes_ = 0;  // the most a training micro-batch's MoE layers kept
  int first_layer_ = 0;
  int last_layer_ = 0;
  int layer_count_ = 0;
  RecomputePlan plan_;
};

}  // namespace mlptrain
