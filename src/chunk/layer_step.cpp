// A layer's forward and backward with the strategies' hooks (see layer_step.hpp).
#include "chunk/layer_step.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace mlptrain {

LayerCall LayerStep::call(std::size_t local, int micro_batch, int micro_batches, bool training) const {
  return {.layer = layers_.global(local), .micro_batch = micro_batch, .micro_batches = micro_batches,
          .training = training, .activation_type = tools_.activation_type, .spec = layers_.spec(local)};
}

void LayerStep::forward(MicroBatchActivations& activations, std::size_t local, void* scratch, const ForwardPass& pass) {
  const LayerSpec& spec = layers_.spec(local);
  const LayerCall layer_call = call(local, pass.micro_batch, pass.micro_batches, pass.training);
  if (gate_) gate_(layer_call.layer);
  ForwardStart start(layer_call, pass.recomputing, layers_.input_rows(activations, local),
                     layers_.input_of(activations, local), layers_.unit(local, false));
  tools_.strategies.before_layer_forward(start);
  const ChunkLayers::Placed placed = layers_.place(local, start.unit);
  // The layer's outputs, for the rows they have (a recomputed layer's kept ones stay).
  const std::int64_t layer_rows = start.layer_rows(), output_rows = start.output_rows(), out = spec.out_features;
  activations.layer_rows[local] = layer_rows;
  activations.output_rows[local] = output_rows;
  if (activations.pre[local].empty()) activations.pre[local] = tools_.allocate_rows(MemoryState::activations, output_rows, out);
  if (spec.gelu && scratch == nullptr && activations.output[local].empty())
    activations.output[local] = tools_.allocate_rows(MemoryState::activations, output_rows, out);
  void* output = scratch != nullptr ? scratch : activations.output[local].as<void>();
  void* pre = activations.pre[local].as<void>();
  // The product has the rows the layer computes on; with other output rows it is transient.
  Buffer product_rows;
  if (output_rows != layer_rows) product_rows = tools_.allocate_rows(MemoryState::workspace, layer_rows, out);
  void* product = product_rows.empty() ? pre : product_rows.as<void>();
  const ForwardProduct computed{
      layer_call, layer_rows, output_rows, product, pre,
      start.bias_after_sum() ? std::optional<const void*>(placed.linear.bias) : std::nullopt};
  // The input's amax the previous layer's GELU took holds for the input this layer computes on
  // where no hook substituted another.
  const bool amax_taken = amax_taken_for_ == local && start.layer_input() == layers_.input_of(activations, local) &&
                          layer_rows == layers_.input_rows(activations, local);
  amax_taken_for_.reset();
  if (const std::optional<MoeLayer>& moe = layers_.moe(local)) {
    const MoeLayer::Pass moe_pass{tools_.kernels, tools_.allocator, tools_.strategies.expert_exchange(), &placed.moe};
    moe->forward(moe_pass, start.layer_input(), layer_rows, product, activations.moe[local],
                 pass.training ? &moe_statistics_ : nullptr);
    tools_.strategies.after_layer_matmul(computed);
  } else {
    if (placed.linear.precision.fp8_gemms()) {
      // The weight's scales are taken once a step, at its first forward (after the hooks placed
      // it), and a weight that stays in the store is coded then for the whole step.
      if (pass.micro_batch == 0 && !pass.recomputing) {
        const AmaxAgreement agree = agreement(layer_call);
        const Fp8Products products{tools_.kernels, tools_.allocator, agree};
        weight_scales_[local].emplace(products, placed.linear);
        weight_codes_[local].reset();
        if (start.unit.values == layers_.unit(local, false).values)
          weight_codes_[local].emplace(products, placed.linear, *weight_scales_[local]);
      }
      activations.fp8_amax[local].input.state = amax_taken ? AmaxState::local : AmaxState::absent;
    }
    forward_product(activations, local, layer_call, placed.linear, start.layer_input(), layer_rows, product,
                    start.bias_after_sum() ? BiasPlace::after_sum : BiasPlace::in_product);
    tools_.strategies.after_layer_matmul(computed);
    // The GELU takes the amax of the next layer's input where that layer's products want it.
    std::optional<float*> next_amax;
    if (spec.gelu && scratch == nullptr && local + 1 < layers_.size() && takes_fp8_amax(local + 1)) {
      SharedAmax& next = activations.fp8_amax[local + 1].input;
      if (next.value.empty()) next.value = tools_.allocator.allocate_floats(MemoryState::workspace, 1);
      next_amax = next.value.floats();
      amax_taken_for_ = local + 1;
    }
    linear_forward_finish(tools_.kernels, placed.linear, output_rows, pre, spec.gelu ? output : pre, next_amax);
  }
  tools_.strategies.after_layer_forward(ForwardDone{layer_call});
}

BackwardStart LayerStep::backward_start(MicroBatchActivations& activations, std::size_t local, int micro_batch,
                                        int micro_batches, BackwardPart part,
                                        std::optional<void*> grad_input) const {
  // B computes the input gradient alone, which reads no input.
  const std::optional<const void*> input =
      part == BackwardPart::input ? std::nullopt : std::optional<const void*>(layers_.input_of(activations, local));
  return BackwardStart(call(local, micro_batch, micro_batches, true), part, layers_.input_rows(activations, local),
                       activations.layer_rows[local], activations.output_rows[local],
                       layers_.unit(local, micro_batch > 0), input, grad_input);
}

LayerStep::ProductGradient LayerStep::product_gradient(MicroBatchActivations& activations, std::size_t local,
                                                       const BackwardStart& start, const LinearLayer& layer,
                                                       const void* grad_output, void* workspace) {
  const std::int64_t output_rows = start.output_rows, layer_rows = start.layer_rows, out = layer.spec.out_features;
  const bool whole = start.part == BackwardPart::whole, split = output_rows != layer_rows;
  // B keeps the products' gradient for W.
  if (!whole) activations.product_grad[local] = tools_.allocate_rows(MemoryState::activations, layer_rows, out);
  void* destination = whole ? workspace : activations.product_grad[local].as<void>();
  // With outputs of other rows than the layer computes on, d loss / d pre has the output rows
  // and the hooks fill the products' gradient for the layer's rows; its bias sums then wait for
  // all rows (from the products' gradient), as B's wait for W.
  ProductGradient made;
  if (split) made.split_grad_pre = tools_.allocate_rows(MemoryState::workspace, output_rows, out);
  const bool sums_bias = whole && !split;
  if (!sums_bias)
    made.unused_bias_sums =
        tools_.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(out), layer.precision.reduce);
  // Unsplit, the GELU's backward makes the products' d(pre) and takes its amax on the way; without
  // a GELU, the last layer's d(pre) is the loss's gradient, whose amax the loss took.
  std::optional<float*> grad_amax;
  if (layer.precision.fp8_gemms()) {
    SharedAmax& shared = activations.fp8_amax[local].output_grad;
    const bool loss_took = shared.state == AmaxState::local && !layer.spec.gelu && !split &&
                           grad_output == activations.loss_grad.as<void>();
    shared.state = loss_took ? AmaxState::local : AmaxState::absent;
    if (!split && layer.spec.gelu && takes_fp8_amax(local)) {
      if (shared.value.empty()) shared.value = tools_.allocator.allocate_floats(MemoryState::workspace, 1);
      grad_amax = shared.value.floats();
      shared.state = AmaxState::local;
    }
  }
  const void* activation_grad =
      layers_.moe(local)
          ? grad_output
          : linear_backward_activation(tools_.kernels, layer, activations.pre[local].as<void>(), grad_output,
                                       output_rows, split ? made.split_grad_pre.as<void>() : destination,
                                       sums_bias ? layer.bias_grad : made.unused_bias_sums.as<void>(),
                                       sums_bias && start.unit.accumulate_grads, grad_amax);
  // Unsplit, the products' gradient is d loss / d pre itself, which no hook writes then. Without
  // a GELU that is the incoming gradient, which the next layer's B overwrites: B keeps a copy.
  made.values = split ? destination : const_cast<void*>(activation_grad);
  if (!whole && !split && activation_grad != destination) {
    tools_.kernels.copy(destination, activation_grad, tools_.activation_type, static_cast<std::size_t>(layer_rows * out));
    made.values = destination;
  }
  tools_.strategies.before_layer_matmul_backward(
      BackwardProduct{start, start.part, layer_rows, output_rows, activation_grad, made.values});
  return made;
}

void LayerStep::backward(MicroBatchActivations& activations, std::size_t local, BackwardStart& start,
                         const void* grad_output, void* workspace, float loss_scale) {
  tools_.strategies.before_layer_backward(start);
  const ChunkLayers::Placed placed = layers_.place(local, start.unit);
  const LinearLayer& layer = placed.linear;
  const BackwardPart part = start.part;
  const bool accumulate = start.unit.accumulate_grads;
  // W reads the products' gradient B kept.
  const ProductGradient product_grad =
      part == BackwardPart::weight ? ProductGradient{.values = activations.product_grad[local].as<void>()}
                                   : product_gradient(activations, local, start, layer, grad_output, workspace);
  const void* layer_input = start.layer_input().value_or(nullptr);
  void* layer_grad_input = start.layer_grad_input().value_or(nullptr);
  if (const std::optional<MoeLayer>& moe = layers_.moe(local)) {
    const MoeLayer::Pass moe_pass{tools_.kernels, tools_.allocator, tools_.strategies.expert_exchange(), &placed.moe};
    moe->backward(moe_pass, layer_input, product_grad.values, start.layer_rows, layer_grad_input,
                  activations.moe[local], accumulate, start.micro_batches, loss_scale);
  } else {
    // The bias sums the activation's backward did not take come from the products' gradient.
    const bool split = start.output_rows != start.layer_rows;
    const bool sums_bias = part == BackwardPart::weight || (part == BackwardPart::whole && split);
    if (sums_bias)
      tools_.kernels.column_sums(product_grad.values, layer.precision.param, layer.bias_grad, layer.precision.reduce,
                                 accumulate, start.layer_rows, layer.spec.out_features);
    const ProductGradients which = part == BackwardPart::whole   ? ProductGradients::both
                                   : part == BackwardPart::input ? ProductGradients::input
                                                                 : ProductGradients::weight;
    backward_products(activations, local, start, layer, layer_input, product_grad.values, start.layer_rows,
                      layer_grad_input, accumulate, which);
  }
  BackwardDone done{start, part, start.rows, start.layer_rows, std::nullopt};
  if (start.grad_input && start.layer_grad_input())
    done.input_gradient = InputGradient{.computed = *start.layer_grad_input(), .destination = *start.grad_input};
  tools_.strategies.after_layer_backward(done);
  if (part == BackwardPart::weight) activations.product_grad[local] = Buffer{};
}

MoeStatistics LayerStep::take_moe_statistics() {
  MoeStatistics taken = std::move(moe_statistics_);
  moe_statistics_.clear();
  return taken;
}

bool LayerStep::takes_fp8_amax(std::size_t local) const {
  const Precision& precision = layers_.precision();
  return !layers_.moe(local) && precision.fp8_gemms() && precision.fp8 == Fp8Recipe::tensorwise;
}

const Fp8WeightScales& LayerStep::weight_scales(std::size_t local) const {
  if (!weight_scales_[local])
    throw std::logic_error(fmt::format("layer {}: an fp8 product before the step's first forward took its weight's scales",
                                       layers_.global(local)));
  return *weight_scales_[local];
}

AmaxAgreement LayerStep::agreement(const LayerCall& call) const {
  StrategyStack& strategies = tools_.strategies;
  return [&strategies, call](const Fp8OperandScales& scales, float* amax) {
    strategies.agree_operand_amax(OperandAmax{call, scales, amax});
  };
}

void LayerStep::forward_product(MicroBatchActivations& activations, std::size_t local, const LayerCall& call,
                                const LinearLayer& layer, const void* input, std::int64_t rows, void* pre,
                                BiasPlace bias) {
  if (!layer.precision.fp8_gemms()) {
    linear_forward_matmul(tools_.kernels, layer, input, rows, pre, bias);
    return;
  }
  const AmaxAgreement agree = agreement(call);
  const Fp8Products products{tools_.kernels, tools_.allocator, agree};
  // A weight gathered for this use is coded for it.
  std::optional<Fp8WeightCodes> gathered;
  if (!weight_codes_[local]) gathered.emplace(products, layer, weight_scales(local), LinearProduct::forward);
  fp8_forward_matmul(products, layer, (weight_codes_[local] ? *weight_codes_[local] : *gathered).forward(), input, rows,
                     pre, activations.fp8_amax[local].input, bias);
}

void LayerStep::backward_products(MicroBatchActivations& activations, std::size_t local, const LayerCall& call,
                                  const LinearLayer& layer, const void* input, const void* grad_pre,
                                  std::int64_t rows, void* grad_input, bool accumulate,
                                  ProductGradients which) {
  if (!layer.precision.fp8_gemms()) {
    linear_backward_matmul(tools_.kernels, layer, input, grad_pre, rows, grad_input, accumulate, which);
    return;
  }
  const AmaxAgreement agree = agreement(call);
  const Fp8Products products{tools_.kernels, tools_.allocator, agree};
  std::optional<Fp8WeightCodes> gathered;
  const auto weight = [&]() -> const Fp8Codes& {
    if (weight_codes_[local]) return weight_codes_[local]->input_gradient();
    gathered.emplace(products, layer, weight_scales(local), LinearProduct::input_gradient);
    return gathered->input_gradient();
  };
  fp8_backward_matmul(products, layer, weight, input, grad_pre, rows, grad_input, accumulate,
                      activations.fp8_amax[local], which);
}

}  // namespace mlptrain
