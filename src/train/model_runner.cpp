// Forward and backward of one micro-batch over the local layers (see model_runner.hpp).
#include "train/model_runner.hpp"

#include <algorithm>

namespace mlptrain {

ModelRunner::ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
                         const std::vector<LayerSpec>& specs, int first_layer, int last_layer,
                         StrategyStack& strategies, const MoeSettings& moe)
    : kernels_(kernels), allocator_(allocator), strategies_(strategies), first_layer_(first_layer),
      last_layer_(last_layer), layer_count_(static_cast<int>(specs.size())) {
  for (int layer = first_layer; layer < last_layer; ++layer) {
    const LayerSpec& spec = specs[layer];
    const std::string path = layer_path(layer, layer_count_);
    if (spec.moe()) {
      layers_.push_back({.spec = spec});
      moe_layers_.emplace_back(MoeLayer(parameters, spec, path, moe));
    } else {
      layers_.push_back(linear_layer_view(parameters, spec, path));
      moe_layers_.emplace_back(std::nullopt);
    }
  }
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
  activations.input = floats(layers_.front().spec.in_features);
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

float* ModelRunner::layer_output(MicroBatchActivations& activations, std::size_t local) const {
  return layers_[local].spec.gelu ? activations.output[local].floats()
                                  : activations.pre[local].floats();
}

LossSums ModelRunner::forward(MicroBatchActivations& activations, int micro_batch,
                              int micro_batches, bool training, LossKind loss_kind,
                              std::int64_t loss_samples) {
  const std::int64_t rows = activations.rows;
  activations.pre.resize(layers_.size());
  activations.output.resize(layers_.size());
  activations.moe.resize(layers_.size());
  const MoeLayer::Pass moe_pass{kernels_, allocator_, strategies_.expert_exchange()};
  const float* input = activations.input.floats();
  for (std::size_t local = 0; local < layers_.size(); ++local) {
    const LinearLayer& layer = layers_[local];
    const auto size = static_cast<std::size_t>(rows * layer.spec.out_features);
    activations.pre[local] = allocator_.allocate_floats(MemoryState::activations, size);
    if (layer.spec.gelu)
      activations.output[local] = allocator_.allocate_floats(MemoryState::activations, size);
    LinearLayer view = layer;
    LayerEvent event{.layer = first_layer_ + static_cast<int>(local),
                     .micro_batch = micro_batch,
                     .micro_batches = micro_batches,
                     .training = training,
                     .rows = rows,
                     .parameters = &view,
                     .input = input};
    strategies_.before_layer_forward(event);
    event.pre = activations.pre[local].floats();
    if (moe_layers_[local]) {
      moe_layers_[local]->forward(moe_pass, input, rows, event.pre, activations.moe[local],
                                  training ? &moe_statistics_ : nullptr);
      event.output = event.pre;
    } else {
      linear_forward_matmul(kernels_, view, input, rows, event.pre);
      strategies_.after_layer_matmul(event);
      event.output = layer_output(activations, local);
      linear_forward_finish(kernels_, view, rows, event.pre, event.output);
    }
    strategies_.after_layer_forward(event);
    input = event.output;
  }
  if (!computes_loss()) return {};
  const std::int64_t outputs = layers_.back().spec.out_features;
  if (training)
    activations.loss_grad = allocator_.allocate_floats(MemoryState::activations,
                                                       static_cast<std::size_t>(rows * outputs));
  return compute_loss(kernels_, loss_kind, input, activations.targets.floats(),
                      activations.labels.as<std::int32_t>(), rows, outputs, loss_samples,
                      activations.loss_grad.floats());
}

void ModelRunner::backward(MicroBatchActivations& activations, int micro_batch,
                           int micro_batches) {
  const std::int64_t rows = activations.rows;
  std::int64_t widest = 0;
  for (const LinearLayer& layer : layers_)
    widest = std::max({widest, layer.spec.in_features, layer.spec.out_features});
  // Three rotating gradient buffers: the incoming gradient, d loss / d pre, and the outgoing one.
  Buffer workspace[3];
  for (Buffer& buffer : workspace)
    buffer = allocator_.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(rows * widest));
  const float* grad_output =
      computes_loss() ? activations.loss_grad.floats() : activations.output_grad.floats();
  if (!reads_inputs())
    activations.input_grad = allocator_.allocate_floats(MemoryState::comm_buffers,
                                                        static_cast<std::size_t>(rows * input_width()));
  const MoeLayer::Pass moe_pass{kernels_, allocator_, strategies_.expert_exchange()};
  int outgoing = 0;
  for (std::size_t local = layers_.size(); local-- > 0;) {
    const LinearLayer& layer = layers_[local];
    const int global_layer = first_layer_ + static_cast<int>(local);
    const float* input = local == 0 ? activations.input.floats() : layer_output(activations, local - 1);
    float* grad_input = global_layer == 0 ? nullptr
                        : local == 0        ? activations.input_grad.floats()
                                            : workspace[outgoing].floats();
    LinearLayer view = layer;
    LayerEvent event{.layer = global_layer,
                     .micro_batch = micro_batch,
                     .micro_batches = micro_batches,
                     .rows = rows,
                     .parameters = &view,
                     .accumulate_grads = micro_batch > 0,
                     .input = input,
                     .pre = activations.pre[local].floats(),
                     .output = layer_output(activations, local),
                     .grad_output = grad_output,
                     .grad_input = grad_input};
    strategies_.before_layer_backward(event);
    if (moe_layers_[local]) {
      moe_layers_[local]->backward(moe_pass, input,
                                   grad_output, rows, grad_input, activations.moe[local],
                                   event.accumulate_grads, micro_batches);
    } else {
      linear_backward(kernels_, view, input, event.pre, grad_output, rows, workspace[2].floats(),
                      grad_input, event.accumulate_grads);
    }
    strategies_.after_layer_backward(event);
    grad_output = grad_input;
    outgoing ^= 1;
  }
  Buffer input_grad = std::move(activations.input_grad);
  activations = MicroBatchActivations{};
  activations.input_grad = std::move(input_grad);
}

std::int64_t ModelRunner::prepared_bytes(std::int64_t rows, LossKind loss_kind) const {
  std::int64_t bytes = rows * input_width() * 4;
  if (computes_loss()) bytes += loss_kind == LossKind::mse ? rows * output_width() * 4 : rows * 4;
  return bytes;
}

std::int64_t ModelRunner::activation_bytes(std::int64_t rows, LossKind loss_kind) const {
  std::int64_t floats = 0;
  std::int64_t bytes = 0;
  for (std::size_t local = 0; local < layers_.size(); ++local) {
    const LayerSpec& spec = layers_[local].spec;
    floats += rows * spec.out_features * (spec.gelu ? 2 : 1);
    if (moe_layers_[local]) bytes += moe_layers_[local]->activation_bytes(rows);
  }
  if (computes_loss()) floats += rows * output_width();  // the loss gradient
  return prepared_bytes(rows, loss_kind) + floats * 4 + bytes;
}

}  // namespace mlptrain
