// Runs this rank's layers forward and backward for one micro-batch, keeping the activations that
// backward needs and calling the strategies' hooks at the fixed points around each layer. With
// recomputation, the local layers form segments of about sqrt(n / 2) layers: forward keeps only
// each segment's input (and the stage's output), and backward recomputes a segment's activations
// before going through it, so a micro-batch holds about 2 sqrt(2n) layer outputs instead of 2n.
#pragma once

#include <functional>
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
              StrategyStack& strategies, const MoeSettings& moe = {}, bool recompute = false);

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

  // The activation bytes a training micro-batch of `rows` samples allocates and frees (the
  // prediction of what prepare, forward and backward do, followed step by step). MoE layers keep
  // what their routing sends them: balanced routing before any training forward, afterwards the
  // most a training micro-batch kept.
  ActivationProfile activation_profile(std::int64_t rows, LossKind loss_kind) const;
  // Called with a layer's index before each forward of it reads its parameters (whose values
  // may still be arriving: an offloaded update runs into the next forward).
  void set_forward_gate(std::function<void(int layer)> gate) { forward_gate_ = std::move(gate); }
  // Local layers per recomputed segment (0 without recomputation).
  std::size_t segment_length() const { return recompute_ ? segment_length_ : 0; }

 private:
  std::int64_t prepared_bytes(std::int64_t rows, LossKind loss_kind) const;
  float* layer_output(MicroBatchActivations& activations, std::size_t local) const;
  // Forward keeps layer `local`'s pre-activation / input for backward (else backward
  // recomputes it); evaluation keeps neither.
  bool keeps_pre(std::size_t local, bool training) const {
    return training && (!recompute_ || !layers_[local].spec.gelu);
  }
  // An MoE layer is never recomputed (its routing would exchange and count again): its output
  // stays as the next layer's input, and its own activations as they are.
  bool keeps_input(std::size_t local, bool training) const {
    return local == 0 ||
           (training && (!recompute_ || local % segment_length_ == 0 || moe_layers_[local - 1]));
  }
  bool ends_segment(std::size_t local) const {
    return local + 1 == layers_.size() || (local + 1) % segment_length_ == 0;
  }
  // Runs layer `local` forward from `input` into its pre-activation and `output`, with the
  // strategies' forward hooks (recomputing: in backward, for a layer whose activations forward
  // did not keep).
  void layer_forward(MicroBatchActivations& activations, std::size_t local, const float* input,
                     float* output, int micro_batch, int micro_batches, bool training,
                     bool recomputing);
  // Recomputes the activations of the local layers [first, last] that forward dropped; the last
  // layer's output is not needed again and goes to `scratch`.
  void recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last,
                         float* scratch, int micro_batch, int micro_batches);

  Kernels& kernels_;
  Allocator& allocator_;
  StrategyStack& strategies_;
  std::function<void(int layer)> forward_gate_;
  // Per local layer: a Linear layer's views, or an MoE layer's shape (its parameters are in
  // moe_layers_).
  std::vector<LinearLayer> layers_;
  std::vector<std::optional<MoeLayer>> moe_layers_;
  MoeStatistics moe_statistics_;
  std::int64_t largest_moe_bytes_ = 0;  // the most a training micro-batch's MoE layers kept
  int first_layer_ = 0;
  int last_layer_ = 0;
  int layer_count_ = 0;
  bool recompute_ = false;
  std::size_t segment_length_ = 1;
};

}  // namespace mlptrain
