// A micro-batch's backward through a chunk's layers, from the last: recomputation of what forward
// dropped, then each layer's backward with the strategies' hooks around it, on the rows forward
// computed on. A Linear layer's backward may run as two actions, for the zero-bubble schedules
// (Qi et al., 2023): B, the input gradient, which the previous chunk waits for, and W, the weight
// and bias gradients, which nothing waits for and a schedule defers into its bubble. B keeps
// d loss / d product for W; W reads it with the layer's input, which stays alive from forward
// until then. The sums are the whole backward's (the same kernels over the same rows in the same
// order), so a split run gives the same gradients as a whole one. An MoE layer runs its whole
// backward in B: its experts' products and their gradients are one exchange.
#pragma once

#include "train/forward_runner.hpp"

namespace mlptrain {

class BackwardRunner {
 public:
  BackwardRunner(const RunnerTools& tools, const ChunkLayers& layers, const RecomputePlan& plan, ForwardRunner& forward)
      : tools_(tools), layers_(layers), plan_(plan), forward_(forward) {}

  // The backward of `part` (see ModelRunner::backward): gradients from `grad_output` (the loss's
  // where the chunk ends the model, else the next chunk's) into the parameters' gradients and
  // the activations' input_grad.
  void backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                BackwardPart part);

 private:
  // The walk over the layers, last first, for the whole backward or its B.
  void walk(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale, BackwardPart part);
  // A layer's whole backward (an MoE layer's in B too) from grad_output into its start's input
  // gradient; `grad_pre` is workspace for d loss / d pre of layer_rows rows.
  void whole(MicroBatchActivations& activations, std::size_t local, BackwardStart& start, const void* grad_output,
             void* grad_pre, int micro_batches, float loss_scale);
  // A Linear layer's B, and its W.
  void input_part(MicroBatchActivations& activations, std::size_t local, BackwardStart& start, const void* grad_output);
  void weight_part(MicroBatchActivations& activations, std::size_t local, int micro_batch, int micro_batches);
  // The start of layer `local`'s backward of `part` (its gradients written by the first
  // micro-batch, added by the later ones), before its hooks.
  BackwardStart start(MicroBatchActivations& activations, std::size_t local, int micro_batch, int micro_batches,
                      BackwardPart part, std::optional<void*> grad_input);
  static BackwardDone done(const BackwardStart& start);
  // Recomputes the activations of the local layers [first, last] that forward dropped; the last
  // layer's output is not needed again and goes to `scratch`.
  void recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last, void* scratch,
                         int micro_batch, int micro_batches);

  const RunnerTools tools_;
  const ChunkLayers& layers_;
  const RecomputePlan& plan_;
  ForwardRunner& forward_;
};

}  // namespace mlptrain
