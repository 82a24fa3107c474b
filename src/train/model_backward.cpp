// Backward of one micro-batch over the local layers (see model_runner.hpp): recomputation of
// what forward dropped, then each layer's backward with the strategies' hooks around it.
// A Linear layer's backward may run as two actions, for the zero-bubble schedules (Qi et al., 2023): B,
// the input gradient, which the previous chunk waits for, and W, the weight and bias gradients,
// which nothing waits for and a schedule defers into its bubble. B keeps d loss / d product for
// W; W reads it with the layer's input, which stays alive from forward until then. The sums are
// the whole backward's (the same kernels over the same rows in the same order), so a split run
// gives the same gradients as a whole one.
#include <algorithm>

#include "train/model_runner.hpp"

namespace mlptrain {

void ModelRunner::recompute_segment(MicroBatchActivations& activations, std::size_t first,
                                    std::size_t last, void* scratch, int micro_batch,
                                    int micro_batches) {
  for (std::size_t local = first; local <= last; ++local) {
    if (!activations.pre[local].empty()) continue;  // kept by forward
    layer_forward(activations, local, local < last ? nullptr : scratch,
                  {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = true, .recomputing = true});
  }
}

LinearLayer ModelRunner::begin_backward(std::size_t local, BackwardEvent& event, MoeParameters& moe_parameters) {
  strategies_.before_layer_backward(event);
  LinearLayer view = layers_[local];
  place_parameters(local, event, view, moe_parameters);
  return view;
}

void ModelRunner::layer_backward(MicroBatchActivations& activations, std::size_t local, BackwardEvent& event,
                                 void* grad_pre, int micro_batches, float loss_scale) {
  MoeParameters moe_parameters;
  const LinearLayer view = begin_backward(local, event, moe_parameters);
  // With outputs of other rows than the layer computes on, d loss / d pre has the output rows
  // (its bias sums wait for all rows, in the products' gradient) and the hooks fill the
  // products' gradient for the layer's rows into the workspace.
  const std::int64_t output_rows = event.output_row_count(), out = view.spec.out_features;
  const bool split = output_rows != event.layer_rows;
  Buffer split_grad_pre, unused_bias_sums;
  if (split) {
    split_grad_pre = allocate_rows(MemoryState::workspace, output_rows, out);
    unused_bias_sums = allocator_.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out),
                                                    view.precision.reduce);
  }
  if (moe_layers_[local]) {
    event.grad_pre = event.grad_output;
  } else {
    event.grad_pre = linear_backward_activation(kernels_, view, activations.pre[local].as<void>(), event.grad_output,
                                                output_rows,
                                                split ? split_grad_pre.as<void>() : grad_pre,
                                                split ? unused_bias_sums.as<void>() : view.bias_grad,
                                                event.accumulate_grads);
  }
  event.grad_product = split ? grad_pre : nullptr;
  strategies_.before_layer_matmul_backward(event);
  const void* product_grad = split ? event.grad_product : event.grad_pre;
  if (moe_layers_[local]) {
    const MoeLayer::Pass moe_pass{kernels_, allocator_, strategies_.expert_exchange(), &moe_parameters};
    moe_layers_[local]->backward(moe_pass, event.layer_input, product_grad, event.layer_rows, event.layer_grad_input,
                                 activations.moe[local], event.accumulate_grads, micro_batches, loss_scale);
  } else {
    if (split)
      kernels_.column_sums(product_grad, view.precision.param, view.bias_grad, view.precision.reduce,
                           event.accumulate_grads, event.layer_rows, out);
    linear_backward_matmul(kernels_, view, event.layer_input, product_grad, event.layer_rows,
                           event.layer_grad_input, event.accumulate_grads);
  }
  strategies_.after_layer_backward(event);
}

BackwardEvent ModelRunner::backward_event(const MicroBatchActivations& activations, std::size_t local, int micro_batch,
                                          int micro_batches, const void* grad_output, void* grad_input) const {
  BackwardEvent event;
  static_cast<LayerEvent&>(event) = layer_event(local);
  event.micro_batch = micro_batch;
  event.micro_batches = micro_batches;
  event.rows = input_rows(activations, local);
  event.grad_input = event.layer_grad_input = grad_input;
  event.layer_rows = activations.layer_rows[local];
  event.output_rows = activations.output_rows[local];
  event.accumulate_grads = micro_batch > 0;
  event.grad_output = grad_output;
  return event;
}

void ModelRunner::backward_pass(MicroBatchActivations& activations, int micro_batch, int micro_batches,
                                float loss_scale, BackwardPart part) {
  const std::int64_t rows = activations.rows;
  std::int64_t widest = 0, most_rows = rows;
  for (const LinearLayer& layer : layers_)
    widest = std::max({widest, layer.spec.in_features, layer.spec.out_features});
  for (std::int64_t layer_rows : activations.layer_rows) most_rows = std::max(most_rows, layer_rows);
  // Three rotating gradient buffers: the incoming gradient, d loss / d pre (and a recomputed
  // segment's discarded last output before that), and the outgoing one.
  Buffer workspace[3];
  for (Buffer& buffer : workspace) buffer = allocate_rows(MemoryState::workspace, most_rows, widest);
  const void* grad_output = computes_loss() ? activations.loss_grad.as<void>() : activations.output_grad.as<void>();
  if (!reads_inputs()) activations.input_grad = allocate_rows(MemoryState::comm_buffers, rows, input_width());
  // B keeps what W reads: every activation (recomputed ones too) and the products' gradients.
  const bool whole = part == BackwardPart::whole;
  if (!whole) activations.product_grad.resize(layers_.size());
  int outgoing = 0;
  for (std::size_t local = layers_.size(); local-- > 0;) {
    if (plan_.ends_segment(local))
      recompute_segment(activations, plan_.segment_start(local), local, whole ? workspace[2].as<void>() : nullptr,
                        micro_batch, micro_batches);
    const int global_layer = first_layer_ + static_cast<int>(local);
    void* grad_input = global_layer == 0 ? nullptr
                       : local == 0        ? activations.input_grad.as<void>()
                                           : workspace[outgoing].as<void>();
    BackwardEvent event = backward_event(activations, local, micro_batch, micro_batches, grad_output, grad_input);
    event.input = event.layer_input = layer_input(activations, local);
    if (whole || moe_layers_[local]) {
      layer_backward(activations, local, event, workspace[2].as<void>(), micro_batches, loss_scale);
    } else {
      event.part = BackwardPart::input;
      layer_backward_input(activations, local, event);
    }
    if (whole) {
      // The layer's activations and its input are read for the last time (the layer below needs
      // only its own input and pre-activation).
      activations.pre[local] = Buffer{};
      activations.output[local] = Buffer{};
      if (local > 0) activations.output[local - 1] = Buffer{};
    }
    grad_output = grad_input;
    outgoing ^= 1;
  }
}

void ModelRunner::backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                           BackwardPart part) {
  if (part == BackwardPart::weight) {
    for (std::size_t local = layers_.size(); local-- > 0;)
      if (!moe_layers_[local]) layer_backward_weight(activations, local, micro_batch, micro_batches);
  } else {
    backward_pass(activations, micro_batch, micro_batches, loss_scale, part);
    // B leaves the activations for W; the received gradient has been read.
    if (part == BackwardPart::input) {
      activations.output_grad = Buffer{};
      return;
    }
  }
  Buffer input_grad = std::move(activations.input_grad);
  activations = MicroBatchActivations{};
  activations.input_grad = std::move(input_grad);
}

void ModelRunner::layer_backward_input(MicroBatchActivations& activations, std::size_t local, BackwardEvent& event) {
  MoeParameters unused;
  const LinearLayer view = begin_backward(local, event, unused);
  const std::int64_t output_rows = event.output_row_count(), out = view.spec.out_features;
  const bool split = output_rows != event.layer_rows;
  const std::size_t count = static_cast<std::size_t>(event.layer_rows * out);
  Buffer& kept = activations.product_grad[local];
  kept = allocate_rows(MemoryState::activations, event.layer_rows, out);
  // d loss / d pre, with its bias sums thrown away (W takes them from the kept gradient).
  Buffer split_grad_pre = split ? allocate_rows(MemoryState::workspace, output_rows, out) : Buffer{};
  Buffer unused_bias_sums =
      allocator_.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out), view.precision.reduce);
  event.grad_pre = linear_backward_activation(kernels_, view, activations.pre[local].as<void>(), event.grad_output,
                                              output_rows, split ? split_grad_pre.as<void>() : kept.as<void>(),
                                              unused_bias_sums.as<void>(), false);
  // Without a GELU the gradient of pre is the incoming one, which the next layer's B overwrites.
  if (!split && event.grad_pre != kept.as<void>())
    kernels_.copy(kept.as<void>(), event.grad_pre, activation_type_, count);
  event.grad_product = split ? kept.as<void>() : nullptr;
  strategies_.before_layer_matmul_backward(event);
  linear_backward_matmul(kernels_, view, nullptr, kept.as<void>(), event.layer_rows, event.layer_grad_input, false,
                         ProductGradients::input);
  strategies_.after_layer_backward(event);
}

void ModelRunner::layer_backward_weight(MicroBatchActivations& activations, std::size_t local, int micro_batch,
                                        int micro_batches) {
  BackwardEvent event = backward_event(activations, local, micro_batch, micro_batches, nullptr, nullptr);
  event.part = BackwardPart::weight;
  event.input = event.layer_input = layer_input(activations, local);
  strategies_.before_layer_backward(event);
  LinearLayer view = layers_[local];
  MoeParameters unused;
  place_parameters(local, event, view, unused);
  const void* product_grad = activations.product_grad[local].as<void>();
  kernels_.column_sums(product_grad, view.precision.param, view.bias_grad, view.precision.reduce,
                       event.accumulate_grads, event.layer_rows, view.spec.out_features);
  linear_backward_matmul(kernels_, view, event.layer_input, product_grad, event.layer_rows, nullptr,
                         event.accumulate_grads, ProductGradients::weight);
  strategies_.after_layer_backward(event);
  activations.product_grad[local] = Buffer{};
}

}  // namespace mlptrain
