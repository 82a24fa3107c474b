// A Linear layer's backward as two actions, for the zero-bubble schedules (Qi et al., 2023): B,
// the input gradient, which the previous chunk waits for, and W, the weight and bias gradients,
// which nothing waits for and a schedule defers into its bubble. B keeps d loss / d product for
// W; W reads it with the layer's input, which stays alive from forward until then. The sums are
// the whole backward's (the same kernels over the same rows in the same order), so a split run
// gives the same gradients as a whole one.
#include <algorithm>

#include "train/model_runner.hpp"

namespace mlptrain {

void ModelRunner::layer_backward_input(MicroBatchActivations& activations, std::size_t local, LayerEvent& event) {
  strategies_.before_layer_backward(event);
  LinearLayer view = layers_[local];
  MoeParameters unused;
  place_parameters(local, event, view, unused);
  const std::int64_t output_rows = event.output_row_count(), out = view.spec.out_features;
  const bool split = output_rows != event.layer_rows;
  const std::size_t count = static_cast<std::size_t>(event.layer_rows * out);
  Buffer& kept = activations.product_grad[local];
  kept = allocate_rows(MemoryState::activations, event.layer_rows, out);
  // d loss / d pre, with its bias sums thrown away (W takes them from the kept gradient).
  Buffer split_grad_pre = split ? allocate_rows(MemoryState::workspace, output_rows, out) : Buffer{};
  Buffer unused_bias_sums =
      allocator_.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out), view.precision.reduce);
  event.grad_pre = linear_backward_activation(kernels_, view, event.pre, event.grad_output, output_rows,
                                              split ? split_grad_pre.as<void>() : kept.as<void>(),
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
  LayerEvent event = backward_event(activations, local, micro_batch, micro_batches, nullptr, nullptr);
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
