// Forward and backward of one micro-batch over the local layers (see model_runner.hpp).
#include "train/model_runner.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mlptrain {

ModelRunner::ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
                         const std::vector<LayerSpec>& specs, int first_layer, int last_layer,
                         StrategyStack& strategies, const MoeSettings& moe, bool recompute)
    : kernels_(kernels), allocator_(allocator), strategies_(strategies), first_layer_(first_layer),
      last_layer_(last_layer), layer_count_(static_cast<int>(specs.size())), recompute_(recompute) {
  // Segments of k layers keep n / k inputs and recompute 2 k activations at a time: k about
  // sqrt(n / 2) makes the sum smallest.
  const auto local_layers = static_cast<double>(last_layer - first_layer);
  segment_length_ = std::max<std::size_t>(1, std::lround(std::sqrt(local_layers / 2)));
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

void ModelRunner::layer_forward(MicroBatchActivations& activations, std::size_t local,
                                const float* input, float* output, int micro_batch,
                                int micro_batches, bool training, bool recomputing) {
  const LinearLayer& layer = layers_[local];
  LinearLayer view = layer;
  LayerEvent event{.layer = first_layer_ + static_cast<int>(local),
                   .micro_batch = micro_batch,
                   .micro_batches = micro_batches,
                   .training = training,
                   .recomputing = recomputing,
                   .rows = activations.rows,
                   .parameters = &view,
                   .input = input};
  if (forward_gate_) forward_gate_(event.layer);
  strategies_.before_layer_forward(event);
  event.pre = activations.pre[local].floats();
  if (moe_layers_[local]) {
    const MoeLayer::Pass moe_pass{kernels_, allocator_, strategies_.expert_exchange()};
    moe_layers_[local]->forward(moe_pass, input, activations.rows, event.pre, activations.moe[local],
                                training ? &moe_statistics_ : nullptr);
    event.output = event.pre;
  } else {
    linear_forward_matmul(kernels_, view, input, activations.rows, event.pre);
    strategies_.after_layer_matmul(event);
    event.output = layer.spec.gelu ? output : event.pre;
    linear_forward_finish(kernels_, view, activations.rows, event.pre, event.output);
  }
  strategies_.after_layer_forward(event);
}

LossSums ModelRunner::forward(MicroBatchActivations& activations, int micro_batch,
                              int micro_batches, bool training, LossKind loss_kind,
                              std::int64_t loss_samples) {
  const std::int64_t rows = activations.rows;
  activations.pre.resize(layers_.size());
  activations.output.resize(layers_.size());
  activations.moe.resize(layers_.size());
  const auto floats = [&](const LinearLayer& layer) {
    return allocator_.allocate_floats(MemoryState::activations,
                                      static_cast<std::size_t>(rows * layer.spec.out_features));
  };
  for (std::size_t local = 0; local < layers_.size(); ++local) {
    const LinearLayer& layer = layers_[local];
    activations.pre[local] = floats(layer);
    if (layer.spec.gelu) activations.output[local] = floats(layer);
    const float* input = local == 0 ? activations.input.floats() : layer_output(activations, local - 1);
    layer_forward(activations, local, input, activations.output[local].floats(), micro_batch,
                  micro_batches, training, false);
    // What backward will not read (or will recompute) goes now; the stage's output stays.
    if (layer.spec.gelu && !keeps_pre(local, training)) activations.pre[local] = Buffer{};
    if (!keeps_input(local, training)) {
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
  const std::int64_t outputs = layers_.back().spec.out_features;
  if (training)
    activations.loss_grad = allocator_.allocate_floats(MemoryState::activations,
                                                       static_cast<std::size_t>(rows * outputs));
  return compute_loss(kernels_, loss_kind, output(activations), activations.targets.floats(),
                      activations.labels.as<std::int32_t>(), rows, outputs, loss_samples,
                      activations.loss_grad.floats());
}

void ModelRunner::recompute_segment(MicroBatchActivations& activations, std::size_t first,
                                    std::size_t last, float* scratch, int micro_batch,
                                    int micro_batches) {
  for (std::size_t local = first; local <= last; ++local) {
    if (!activations.pre[local].empty()) continue;  // kept by forward
    const auto size = static_cast<std::size_t>(activations.rows * layers_[local].spec.out_features);
    activations.pre[local] = allocator_.allocate_floats(MemoryState::activations, size);
    if (local < last && activations.output[local].empty())
      activations.output[local] = allocator_.allocate_floats(MemoryState::activations, size);
    const float* input = local == 0 ? activations.input.floats() : layer_output(activations, local - 1);
    float* output = local < last ? activations.output[local].floats() : scratch;
    layer_forward(activations, local, input, output, micro_batch, micro_batches, true, true);
  }
}

void ModelRunner::backward(MicroBatchActivations& activations, int micro_batch,
                           int micro_batches) {
  const std::int64_t rows = activations.rows;
  std::int64_t widest = 0;
  for (const LinearLayer& layer : layers_)
    widest = std::max({widest, layer.spec.in_features, layer.spec.out_features});
  // Three rotating gradient buffers: the incoming gradient, d loss / d pre (and a recomputed
  // segment's discarded last output before that), and the outgoing one.
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
    if (recompute_ && ends_segment(local))
      recompute_segment(activations, local - local % segment_length_, local, workspace[2].floats(),
                        micro_batch, micro_batches);
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
    // The layer's activations and its input are read for the last time (the layer below needs
    // only its own input and pre-activation).
    activations.pre[local] = Buffer{};
    activations.output[local] = Buffer{};
    if (local > 0) activations.output[local - 1] = Buffer{};
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

ActivationProfile ModelRunner::activation_profile(std::int64_t rows, LossKind loss_kind) const {
  // Follows forward and backward allocation by allocation.
  ActivationProfile profile{.received = prepared_bytes(rows, loss_kind)};
  std::int64_t alive = profile.received, peak = alive;
  const auto allocate = [&](std::int64_t bytes) { peak = std::max(peak, alive += bytes); };
  const std::size_t count = layers_.size();
  std::vector<std::int64_t> pre(count, 0), output(count, 0);
  const auto layer_bytes = [&](std::size_t local) { return rows * layers_[local].spec.out_features * 4; };
  const auto free = [&](std::int64_t& bytes) { alive -= std::exchange(bytes, 0); };
  for (std::size_t local = 0; local < count; ++local) {
    allocate(pre[local] = layer_bytes(local));
    if (layers_[local].spec.gelu) allocate(output[local] = layer_bytes(local));
    if (moe_layers_[local] && largest_moe_bytes_ == 0) allocate(moe_layers_[local]->activation_bytes(rows));
    if (layers_[local].spec.gelu && !keeps_pre(local, true)) free(pre[local]);
    if (!keeps_input(local, true)) {
      free(output[local - 1]);
      free(pre[local - 1]);
    }
  }
  allocate(largest_moe_bytes_);
  if (computes_loss()) allocate(rows * output_width() * 4);
  profile.forward_peak = peak;
  profile.kept = peak = alive;
  for (std::size_t local = count; local-- > 0;) {
    if (recompute_ && ends_segment(local))
      for (std::size_t layer = local - local % segment_length_; layer <= local; ++layer) {
        if (pre[layer] != 0) continue;
        allocate(pre[layer] = layer_bytes(layer));
        if (layer < local && output[layer] == 0) allocate(output[layer] = layer_bytes(layer));
      }
    free(pre[local]);
    free(output[local]);
    if (local > 0) free(output[local - 1]);
  }
  profile.backward_peak = peak;
  return profile;
}

}  // namespace mlptrain
