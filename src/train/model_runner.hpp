// Runs this rank's layers forward and backward for one micro-batch, keeping the activations that
// backward needs and calling the strategies' hooks at the fixed points around each layer.
#pragma once

#include <optional>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/linear.hpp"
#include "model/loss.hpp"
#include "model/moe.hpp"
#include "train/strategy_stack.hpp"

namespace mlptrain {

// What one micro-batch's forward keeps for its backward (charged as activations), and the
// gradients that cross a stage boundary (charged as comm_buffers: they exist for a transfer).
struct MicroBatchActivations {
  std::int64_t rows = 0;
  Buffer input;               // the first local layer's input
  std::vector<Buffer> pre;    // per local layer: x W^T + b
  std::vector<Buffer> output; // per local layer with a GELU: GELU(pre)
  Buffer targets;             // regression targets (where the loss is computed)
  Buffer labels;              // class labels (where the loss is computed)
  Buffer loss_grad;           // d loss / d model output (training only)
  Buffer output_grad;         // d loss / d local output, received from the next stage
  Buffer input_grad;          // d loss / d local input, for the previous stage
  std::vector<MoeActivations> moe;  // per local layer (used by MoE layers)
};

class ModelRunner {
 public:
  ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
              const std::vector<LayerSpec>& specs, int first_layer, int last_layer,
              StrategyStack& strategies, const MoeSettings& moe = {});

  bool computes_loss() const { return last_layer_ == layer_count_; }
  bool reads_inputs() const { return first_layer_ == 0; }
  // Features per row of the local input and output (this rank's slices).
  std::int64_t input_width() const { return layers_.front().spec.in_features; }
  std::int64_t output_width() const { return layers_.back().spec.out_features; }
  // The last local layer's output of a micro-batch whose forward is done.
  float* output(MicroBatchActivations& activations) const {
    return layer_output(activations, layers_.size() - 1);
  }
  const std::vector<LinearLayer>& layers() const { return layers_; }
  // The routing statistics of the training forwards since the last call (MoE layers).
  MoeStatistics take_moe_statistics();

  // Buffers for a micro-batch of `rows` samples: the input, and targets or labels when this rank
  // computes the loss.
  MicroBatchActivations prepare(std::int64_t rows, LossKind loss_kind);

  // Forward through the local layers. Where the loss is computed, returns its sums and (when
  // training) fills loss_grad with the gradient of the mean over `loss_samples` samples.
  LossSums forward(MicroBatchActivations& activations, int micro_batch, int micro_batches,
                   bool training, LossKind loss_kind, std::int64_t loss_samples);
  // Backward through the local layers, accumulating parameter gradients over micro-batches
  // (the first micro-batch overwrites), from the loss gradient where the loss is computed and
  // else from output_grad. Frees the micro-batch's activations; input_grad holds d loss / d input
  // afterwards unless the local layers start the model.
  void backward(MicroBatchActivations& activations, int micro_batch, int micro_batches);

  // Bytes one micro-batch of `rows` samples keeps for backward (the prediction of what prepare
  // and forward allocate), and the part of them that prepare allocates.
  std::int64_t activation_bytes(std::int64_t rows, LossKind loss_kind) const;
  std::int64_t prepared_bytes(std::int64_t rows, LossKind loss_kind) const;

 private:
  float* layer_output(MicroBatchActivations& activations, std::size_t local) const;

  Kernels& kernels_;
  Allocator& allocator_;
  StrategyStack& strategies_;
  // Per local layer: a Linear layer's views, or an MoE layer's shape (its parameters are in
  // moe_layers_).
  std::vector<LinearLayer> layers_;
  std::vector<std::optional<MoeLayer>> moe_layers_;
  MoeStatistics moe_statistics_;
  int first_layer_ = 0;
  int last_layer_ = 0;
  int layer_count_ = 0;
};

}  // namespace mlptrain
