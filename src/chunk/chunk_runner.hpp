// Runs one model chunk (a contiguous range of layers; a rank holding several has one runner each)
// forward and backward for a micro-batch, as the schedule's executor asks: the buffers of a
// micro-batch, the walk forward through the chunk's layers (each a LayerStep, layer_step.hpp)
// and the loss where the chunk ends the model, the walk back, whole or split into B and W,
// keeping what the recomputation plan (model/recompute_plan.hpp) says and recomputing what it
// dropped by running the same layers forward again.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "chunk/layer_step.hpp"
#include "model/loss.hpp"
#include "model/recompute_plan.hpp"

namespace mlptrain {

class ChunkRunner {
 public:
  ChunkRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
              const std::vector<LayerSpec>& specs, LayerRange chunk, StrategyStack& strategies,
              const MoeSettings& moe = {}, bool recompute = false);

  bool computes_loss() const { return layers_.ends_model(); }
  bool reads_inputs() const { return layers_.starts_model(); }
  // Features per row of the local input and output (this rank's slices), and their type.
  std::int64_t input_width() const { return layers_.spec(0).in_features; }
  std::int64_t output_width() const { return layers_.spec(layers_.size() - 1).out_features; }
  DataType activation_type() const { return tools_.activation_type; }
  // The last local layer's output of a micro-batch whose forward is done, and its rows.
  void* output(MicroBatchActivations& activations) const { return layers_.output_of(activations, layers_.size() - 1); }
  static std::int64_t output_rows(const MicroBatchActivations& activations) {
    return activations.output_rows.empty() ? activations.rows : activations.output_rows.back();
  }
  // The routing statistics of the training forwards since the last call (MoE layers).
  MoeStatistics take_moe_statistics() { return step_.take_moe_statistics(); }
  // The most activation memory a training micro-batch's MoE layers kept so far (0: none ran).
  std::int64_t largest_moe_bytes() const { return largest_moe_bytes_; }
  // Called with a layer's index before each forward of it reads its parameters.
  void set_forward_gate(std::function<void(int layer)> gate) { step_.set_gate(std::move(gate)); }
  const RecomputePlan& recompute_plan() const { return plan_; }

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
  // unless the local layers start the model. Split (a zero-bubble schedule's B and W): `input`
  // computes the input gradients and keeps every activation and each Linear layer's d loss / d
  // product; `weight` then computes the Linear layers' weight and bias gradients and frees the
  // micro-batch's activations. Each layer's hooks see the part.
  void backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale = 1.0f,
                BackwardPart part = BackwardPart::whole);

 private:
  // The loss of the last layer's output, its gradient into loss_grad when training.
  LossSums loss(MicroBatchActivations& activations, bool training, LossKind loss_kind, std::int64_t loss_samples,
                float loss_scale);

  // The walk back over the layers, last first, for the whole backward or its B.
  void walk_back(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                 BackwardPart part);
  // Recomputes the activations of the local layers [first, last] that forward dropped; the last
  // layer's output is not needed again and goes to `scratch`.
  void recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last, void* scratch,
                         int micro_batch, int micro_batches);

  const StepTools tools_;
  const ChunkLayers layers_;
  const RecomputePlan plan_;
  LayerStep step_;
  std::int64_t largest_moe_bytes_ = 0;
};

}  // namespace mlptrain
