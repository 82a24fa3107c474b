// Forward and backward of one micro-batch over the local layers (see model_runner.hpp).
#include "train/model_runner.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mlptrain {

namespace {

// The local layers' views: a Linear layer's into the store, an MoE layer's shape.
std::vector<LinearLayer> local_views(const ParameterStore& parameters, const std::vector<LayerSpec>& specs,
                                     LayerRange local) {
  std::vector<LinearLayer> views;
  for (int layer = local.first; layer < local.last; ++layer) {
    const LayerSpec& spec = specs[static_cast<std::size_t>(layer)];
    views.push_back(spec.moe() ? LinearLayer{.spec = spec, .precision = parameters.precision()}
                               : linear_layer_view(parameters, spec, layer_path(layer, static_cast<int>(specs.size()))));
  }
  return views;
}

std::vector<LayerSpec> specs_of(const std::vector<LinearLayer>& layers) {
  std::vector<LayerSpec> specs;
  for (const LinearLayer& layer : layers) specs.push_back(layer.spec);
  return specs;
}

}  // namespace

ModelRunner::ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
                         const std::vector<LayerSpec>& specs, LayerRange local, StrategyStack& strategies,
                         const MoeSettings& moe, bool recompute)
    : kernels_(kernels), allocator_(allocator), strategies_(strategies),
      activation_type_(parameters.precision().param), layers_(local_views(parameters, specs, local)), first_layer_(local.first), last_layer_(local.last),
      layer_count_(static_cast<int>(specs.size())), plan_(specs_of(layers_), recompute) {
  for (int layer = local.first; layer < local.last; ++layer) {
    const LayerSpec& spec = specs[static_cast<std::size_t>(layer)];
    const std::string path = layer_path(layer, layer_count_);
    const std::size_t unit = parameters.unit_range(layer).offset;
    StoreUnit place{.values = parameters.value_at(unit), .grads = parameters.grad_at(unit)};
    if (spec.moe()) {
      moe_layers_.emplace_back(MoeLayer(parameters, spec, path, moe));
    } else {
      moe_layers_.emplace_back(std::nullopt);
      place.weight_at = parameters.tensor(path + "/weight").offset - unit;
      place.bias_at = parameters.tensor(path + "/bias").offset - unit;
    }
    units_.push_back(place);
  }
}

LayerEvent ModelRunner::layer_event(std::size_t local) const {
  return {.layer = first_layer_ + static_cast<int>(local),
          .activation_type = activation_type_,
          .unit_values = units_[local].values,
          .unit_grads = units_[local].grads,
          .parameters = &layers_[local]};
}

void ModelRunner::place_parameters(std::size_t local, LayerEvent& event, LinearLayer& view,
                                   MoeParameters& moe_parameters) const {
  if (moe_layers_[local]) {
    moe_parameters = moe_layers_[local]->bind(event.unit_values, event.unit_grads);
  } else {
    const Precision precision = view.precision;
    view.weight = advance(event.unit_values, units_[local].weight_at, precision.param);
    view.bias = advance(event.unit_values, units_[local].bias_at, precision.param);
    view.weight_grad = advance(event.unit_grads, units_[local].weight_at, precision.reduce);
    view.bias_grad = advance(event.unit_grads, units_[local].bias_at, precision.reduce);
  }
  event.parameters = &view;
}

MoeStatistics ModelRunner::take_moe_statistics() {
  MoeStatistics taken = std::move(moe_statistics_);
  moe_statistics_.clear();
  return taken;
}

MicroBatchActivations ModelRunner::prepare(std::int64_t rows, LossKind loss_kind) {
  MicroBatchActivations activations;
  activations.rows = rows;
  const auto floats = [&](std::int64_t columns) {
    return allocator_.allocate_floats(MemoryState::activations,
                                      static_cast<std::size_t>(rows * columns));
  };
  activations.input = allocate_rows(MemoryState::activations, rows, layers_.front().spec.in_features);
  if (computes_loss()) {
    const std::int64_t outputs = layers_.back().spec.out_features;
    if (loss_kind == LossKind::mse) {
      activations.targets = floats(outputs);
    } else {
      activations.labels = allocator_.allocate(MemoryState::activations,
                                               static_cast<std::size_t>(rows) * sizeof(std::int32_t));
    }
  }
  return activations;
}

void* ModelRunner::layer_output(MicroBatchActivations& activations, std::size_t local) const {
  return layers_[local].spec.gelu ? activations.output[local].as<void>() : activations.pre[local].as<void>();
}

void ModelRunner::layer_forward(MicroBatchActivations& activations, std::size_t local, void* scratch,
                                const ForwardPass& pass) {
  const LinearLayer& layer = layers_[local];
  ForwardEvent event;
  static_cast<LayerEvent&>(event) = layer_event(local);
  event.micro_batch = pass.micro_batch;
  event.micro_batches = pass.micro_batches;
  event.training = pass.training;
  event.recomputing = pass.recomputing;
  event.rows = event.layer_rows = input_rows(activations, local);
  event.input = event.layer_input = layer_input(activations, local);
  if (forward_gate_) forward_gate_(event.layer);
  strategies_.before_layer_forward(event);
  LinearLayer view = layer;
  MoeParameters moe_parameters;
  place_parameters(local, event, view, moe_parameters);
  // The layer's outputs, for the rows they have (a recomputed layer's kept ones stay).
  const std::int64_t output_rows = event.output_row_count();
  activations.layer_rows[local] = event.layer_rows;
  activations.output_rows[local] = output_rows;
  const std::int64_t out = layer.spec.out_features;
  if (activations.pre[local].empty())
    activations.pre[local] = allocate_rows(MemoryState::activations, output_rows, out);
  if (layer.spec.gelu && scratch == nullptr && activations.output[local].empty())
    activations.output[local] = allocate_rows(MemoryState::activations, output_rows, out);
  void* output = scratch != nullptr ? scratch : activations.output[local].as<void>();
  event.pre = activations.pre[local].as<void>();
  // The product has the rows the layer computes on; with other output rows it is transient.
  Buffer product;
  if (output_rows != event.layer_rows) product = allocate_rows(MemoryState::workspace, event.layer_rows, out);
  event.product = product.empty() ? event.pre : product.as<void>();
  if (moe_layers_[local]) {
    const MoeLayer::Pass moe_pass{kernels_, allocator_, strategies_.expert_exchange(), &moe_parameters};
    moe_layers_[local]->forward(moe_pass, event.layer_input, event.layer_rows, event.product, activations.moe[local],
                                pass.training ? &moe_statistics_ : nullptr);
    strategies_.after_layer_matmul(event);
    event.output = event.pre;
  } else {
    linear_forward_matmul(kernels_, view, event.layer_input, event.layer_rows, event.product, event.bias);
    strategies_.after_layer_matmul(event);
    event.output = layer.spec.gelu ? output : event.pre;
    linear_forward_finish(kernels_, view, output_rows, event.pre, event.output);
  }
  strategies_.after_layer_forward(event);
}

LossSums ModelRunner::forward(MicroBatchActivations& activations, int micro_batch,
                              int micro_batches, bool training, LossKind loss_kind,
                              std::int64_t loss_samples, float loss_scale) {
  activations.pre.resize(layers_.size());
  activations.output.resize(layers_.size());
  activations.moe.resize(layers_.size());
  activations.layer_rows.resize(layers_.size());
  activations.output_rows.resize(layers_.size());
  for (std::size_t local = 0; local < layers_.size(); ++local) {
    layer_forward(activations, local, nullptr,
                  {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = training});
    // What backward will not read (or will recompute) goes now; the stage's output stays.
    if (layers_[local].spec.gelu && !plan_.keeps_pre(local, training)) activations.pre[local] = Buffer{};
    if (!plan_.keeps_input(local, training)) {
      activations.output[local - 1] = Buffer{};
      activations.pre[local - 1] = Buffer{};
    }
  }
  if (training) {
    std::int64_t moe_bytes = 0;
    for (const MoeActivations& moe : activations.moe) moe_bytes += moe.bytes();
    largest_moe_bytes_ = std::max(largest_moe_bytes_, moe_bytes);
  }
  if (!computes_loss()) return {};
  return loss(activations, training, loss_kind, loss_samples, loss_scale);
}

LossSums ModelRunner::loss(MicroBatchActivations& activations, bool training, LossKind loss_kind,
                           std::int64_t loss_samples, float loss_scale) {
  const std::int64_t rows = activations.rows, outputs = layers_.back().spec.out_features;
  const auto count = static_cast<std::size_t>(rows * outputs);
  if (training) activations.loss_grad = allocate_rows(MemoryState::activations, rows, outputs);
  // fp32 output and gradient: the layer's own memory, or widened copies in the workspace.
  const bool widened = activation_type_ != DataType::float32;
  Buffer output32, grad32;
  if (widened) {
    output32 = allocator_.allocate_floats(MemoryState::workspace, count);
    kernels_.convert(output(activations), activation_type_, output32.floats(), DataType::float32, count);
    if (training) grad32 = allocator_.allocate_floats(MemoryState::workspace, count);
  }
  float* grad = !training ? nullptr : widened ? grad32.floats() : activations.loss_grad.floats();
  const LossSums sums =
      compute_loss(kernels_, loss_kind, widened ? output32.floats() : static_cast<const float*>(output(activations)),
                   activations.targets.floats(), activations.labels.as<std::int32_t>(), rows, outputs, loss_samples,
                   grad);
  if (grad == nullptr) return sums;
  // The backward starts from the loss's gradient: the targets are not needed past this point,
  // and a loss stage holding several micro-batches (a V's stage 0) should not keep them.
  activations.targets.reset();
  activations.labels.reset();
  if (loss_scale != 1.0f) kernels_.scale(grad, count, loss_scale);
  if (widened) kernels_.convert(grad, DataType::float32, activations.loss_grad.as<void>(), activation_type_, count);
  return sums;
}

}  // namespace mlptrain
