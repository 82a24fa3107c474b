// A chunk's backward (see backward_runner.hpp).
#include "train/backward_runner.hpp"

#include <algorithm>

namespace mlptrain {

BackwardStart BackwardRunner::start(MicroBatchActivations& activations, std::size_t local, int micro_batch,
                                    int micro_batches, BackwardPart part, std::optional<void*> grad_input) {
  const LayerCall call = tools_.call(layers_.global(local), layers_.spec(local), micro_batch, micro_batches, true);
  // B computes the input gradient alone, which reads no input.
  const std::optional<const void*> input =
      part == BackwardPart::input ? std::nullopt : std::optional<const void*>(layers_.input_of(activations, local));
  return BackwardStart(call, part, layers_.input_rows(activations, local), activations.layer_rows[local],
                       activations.output_rows[local], layers_.unit(local, micro_batch > 0), input, grad_input);
}

BackwardDone BackwardRunner::done(const BackwardStart& start) {
  BackwardDone finished{start, start.part, start.rows, start.layer_rows, std::nullopt};
  if (start.grad_input && start.layer_grad_input())
    finished.input_gradient = InputGradient{.computed = *start.layer_grad_input(), .destination = *start.grad_input};
  return finished;
}

void BackwardRunner::recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last,
                                       void* scratch, int micro_batch, int micro_batches) {
  for (std::size_t local = first; local <= last; ++local) {
    if (!activations.pre[local].empty()) continue;  // kept by forward
    forward_.layer(activations, local, local < last ? nullptr : scratch,
                   {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = true, .recomputing = true});
  }
}

void BackwardRunner::whole(MicroBatchActivations& activations, std::size_t local, BackwardStart& start,
                           const void* grad_output, void* grad_pre, int micro_batches, float loss_scale) {
  tools_.strategies.before_layer_backward(start);
  const ChunkLayers::Placed placed = layers_.place(local, start.unit);
  const LinearLayer& view = placed.linear;
  // With outputs of other rows than the layer computes on, d loss / d pre has the output rows
  // (its bias sums wait for all rows, in the products' gradient) and the hooks fill the
  // products' gradient for the layer's rows into the workspace.
  const std::int64_t output_rows = start.output_rows, layer_rows = start.layer_rows, out = view.spec.out_features;
  const bool split = output_rows != layer_rows;
  const bool accumulate = start.unit.accumulate_grads;
  Buffer split_grad_pre, unused_bias_sums;
  if (split) {
    split_grad_pre = tools_.allocate_rows(MemoryState::workspace, output_rows, out);
    unused_bias_sums =
        tools_.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out), view.precision.reduce);
  }
  const std::optional<MoeLayer>& moe = layers_.moe(local);
  const void* activation_grad =
      moe ? grad_output
          : linear_backward_activation(tools_.kernels, view, activations.pre[local].as<void>(), grad_output, output_rows,
                                       split ? split_grad_pre.as<void>() : grad_pre,
                                       split ? unused_bias_sums.as<void>() : view.bias_grad, accumulate);
  // Unsplit, the products' gradient is d loss / d pre itself, which no hook writes then.
  void* product_grad = split ? grad_pre : const_cast<void*>(activation_grad);
  tools_.strategies.before_layer_matmul_backward(
      BackwardProduct{start, start.part, layer_rows, output_rows, activation_grad, product_grad});
  const void* layer_input = start.layer_input().value_or(nullptr);
  void* layer_grad_input = start.layer_grad_input().value_or(nullptr);
  if (moe) {
    const MoeLayer::Pass moe_pass{tools_.kernels, tools_.allocator, tools_.strategies.expert_exchange(), &placed.moe};
    moe->backward(moe_pass, layer_input, product_grad, layer_rows, layer_grad_input, activations.moe[local], accumulate,
                  micro_batches, loss_scale);
  } else {
    if (split)
      tools_.kernels.column_sums(product_grad, view.precision.param, view.bias_grad, view.precision.reduce, accumulate,
                                 layer_rows, out);
    tools_.backward_products(start, view, layer_input, product_grad, layer_rows, layer_grad_input, accumulate);
  }
  tools_.strategies.after_layer_backward(done(start));
}

void BackwardRunner::input_part(MicroBatchActivations& activations, std::size_t local, BackwardStart& start,
                                const void* grad_output) {
  tools_.strategies.before_layer_backward(start);
  const LinearLayer view = layers_.place(local, start.unit).linear;
  const std::int64_t output_rows = start.output_rows, layer_rows = start.layer_rows, out = view.spec.out_features;
  const bool split = output_rows != layer_rows;
  const auto count = static_cast<std::size_t>(layer_rows * out);
  Buffer& kept = activations.product_grad[local];
  kept = tools_.allocate_rows(MemoryState::activations, layer_rows, out);
  // d loss / d pre, with its bias sums thrown away (W takes them from the kept gradient).
  Buffer split_grad_pre = split ? tools_.allocate_rows(MemoryState::workspace, output_rows, out) : Buffer{};
  Buffer unused_bias_sums =
      tools_.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out), view.precision.reduce);
  const void* grad_pre = linear_backward_activation(tools_.kernels, view, activations.pre[local].as<void>(), grad_output,
                                                    output_rows, split ? split_grad_pre.as<void>() : kept.as<void>(),
                                                    unused_bias_sums.as<void>(), false);
  // Without a GELU the gradient of pre is the incoming one, which the next layer's B overwrites.
  if (!split && grad_pre != kept.as<void>()) tools_.kernels.copy(kept.as<void>(), grad_pre, tools_.activation_type, count);
  tools_.strategies.before_layer_matmul_backward(
      BackwardProduct{start, start.part, layer_rows, output_rows, grad_pre, kept.as<void>()});
  tools_.backward_products(start, view, nullptr, kept.as<void>(), layer_rows, start.layer_grad_input().value_or(nullptr),
                           false, ProductGradients::input);
  tools_.strategies.after_layer_backward(done(start));
}

void BackwardRunner::weight_part(MicroBatchActivations& activations, std::size_t local, int micro_batch,
                                 int micro_batches) {
  BackwardStart weight = start(activations, local, micro_batch, micro_batches, BackwardPart::weight, std::nullopt);
  tools_.strategies.before_layer_backward(weight);
  const LinearLayer view = layers_.place(local, weight.unit).linear;
  const void* product_grad = activations.product_grad[local].as<void>();
  const bool accumulate = weight.unit.accumulate_grads;
  tools_.kernels.column_sums(product_grad, view.precision.param, view.bias_grad, view.precision.reduce, accumulate,
                             weight.layer_rows, view.spec.out_features);
  tools_.backward_products(weight, view, *weight.layer_input(), product_grad, weight.layer_rows, nullptr, accumulate,
                           ProductGradients::weight);
  tools_.strategies.after_layer_backward(done(weight));
  activations.product_grad[local] = Buffer{};
}

void BackwardRunner::walk(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                          BackwardPart part) {
  const std::int64_t rows = activations.rows;
  std::int64_t widest = 0, most_rows = rows;
  for (std::size_t local = 0; local < layers_.size(); ++local)
    widest = std::max({widest, layers_.spec(local).in_features, layers_.spec(local).out_features});
  for (std::int64_t layer_rows : activations.layer_rows) most_rows = std::max(most_rows, layer_rows);
  // Three rotating gradient buffers: the incoming gradient, d loss / d pre (and a recomputed
  // segment's discarded last output before that), and the outgoing one.
  Buffer workspace[3];
  for (Buffer& buffer : workspace) buffer = tools_.allocate_rows(MemoryState::workspace, most_rows, widest);
  const void* grad_output = layers_.ends_model() ? activations.loss_grad.as<void>() : activations.output_grad.as<void>();
  if (!layers_.starts_model())
    activations.input_grad = tools_.allocate_rows(MemoryState::comm_buffers, rows, layers_.spec(0).in_features);
  // B keeps what W reads: every activation (recomputed ones too) and the products' gradients.
  const bool whole_backward = part == BackwardPart::whole;
  if (!whole_backward) activations.product_grad.resize(layers_.size());
  int outgoing = 0;
  for (std::size_t local = layers_.size(); local-- > 0;) {
    if (plan_.ends_segment(local))
      recompute_segment(activations, plan_.segment_start(local), local,
                        whole_backward ? workspace[2].as<void>() : nullptr, micro_batch, micro_batches);
    const std::optional<void*> grad_input = layers_.global(local) == 0 ? std::nullopt
                                            : local == 0 ? std::optional<void*>(activations.input_grad.as<void>())
                                                         : std::optional<void*>(workspace[outgoing].as<void>());
    // An MoE layer's backward is whole in B as well.
    if (whole_backward || layers_.moe(local)) {
      BackwardStart layer = start(activations, local, micro_batch, micro_batches, BackwardPart::whole, grad_input);
      whole(activations, local, layer, grad_output, workspace[2].as<void>(), micro_batches, loss_scale);
    } else {
      BackwardStart layer = start(activations, local, micro_batch, micro_batches, BackwardPart::input, grad_input);
      input_part(activations, local, layer, grad_output);
    }
    if (whole_backward) {
      // The layer's activations and its input are read for the last time (the layer below needs
      // only its own input and pre-activation).
      activations.pre[local] = Buffer{};
      activations.output[local] = Buffer{};
      if (local > 0) activations.output[local - 1] = Buffer{};
    }
    grad_output = grad_input.value_or(nullptr);
    outgoing ^= 1;
  }
}

void BackwardRunner::backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                              BackwardPart part) {
  if (part == BackwardPart::weight) {
    for (std::size_t local = layers_.size(); local-- > 0;)
      if (!layers_.moe(local)) weight_part(activations, local, micro_batch, micro_batches);
  } else {
    walk(activations, micro_batch, micro_batches, loss_scale, part);
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

}  // namespace mlptrain
