// Flat parameter storage and layout-independent initialization (see parameter_store.hpp).
#include "model/parameter_store.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>

namespace mlptrain {

namespace {
std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

std::vector<ParameterTensor> model_parameter_tensors(const std::vector<LayerSpec>& specs, int first,
                                                     int last, const ParameterPlan& plan) {
  std::vector<int> layers(static_cast<std::size_t>(last - first));
  std::iota(layers.begin(), layers.end(), first);
  return model_parameter_tensors(specs, layers, plan);
}

std::vector<ParameterTensor> model_parameter_tensors(const std::vector<LayerSpec>& specs, const std::vector<int>& layers,
                                                     const ParameterPlan& plan) {
  const int last = layers.empty() ? 0 : layers.back() + 1;
  const auto unit_multiple = static_cast<std::size_t>(plan.unit_multiple);
  const int layer_count = static_cast<int>(specs.size());
  std::vector<ParameterTensor> tensors;
  std::size_t offset = 0;
  int global_index = 0;
  for (int layer = 0; layer < last; ++layer) {
    const LayerSpec& spec = specs[layer];
    const float bound = 1.0f / std::sqrt(static_cast<float>(spec.in_features));
    const std::string base = layer_path(layer, layer_count);
    std::vector<ParameterTensor> layer_tensors;
    const auto add = [&](std::string name, std::vector<std::int64_t> shape, bool expert) {
      layer_tensors.push_back({.path = base + "/" + std::move(name),
                               .layer = layer,
                               .global_index = global_index++,
                               .global_shape = shape,
                               .local_start = std::vector<std::int64_t>(shape.size(), 0),
                               .local_shape = shape,
                               .init_bound = bound,
                               .expert = expert});
    };
    if (spec.moe()) {
      add("router/weight", {spec.experts, spec.in_features}, false);
      add("experts/weight", {spec.experts, spec.out_features, spec.in_features}, true);
      add("experts/bias", {spec.experts, spec.out_features}, true);
    } else {
      add("weight", {spec.out_features, spec.in_features}, false);
      add("bias", {spec.out_features}, false);
    }
    if (!std::binary_search(layers.begin(), layers.end(), layer)) continue;
    for (std::size_t index = 0; index < layer_tensors.size(); ++index) {
      ParameterTensor& tensor = layer_tensors[index];
      // An MoE layer's experts have other replicas than its router: each piece is padded, so
      // that a strategy sharding a piece over its replicas can split it evenly.
      if (index > 0 && tensor.expert != layer_tensors[index - 1].expert) offset = round_up(offset, unit_multiple);
      for (const auto& split : plan.splits) split(tensor);
      tensor.count = 1;
      for (std::int64_t extent : tensor.local_shape) tensor.count *= static_cast<std::size_t>(extent);
      tensor.offset = offset;
      offset += tensor.count;
      tensors.push_back(std::move(tensor));
    }
    offset = round_up(offset, unit_multiple);
  }
  return tensors;
}

std::size_t store_size(const std::vector<ParameterTensor>& tensors, int unit_multiple) {
  std::size_t size = 0;
  for (const auto& tensor : tensors)
    size = std::max(size, round_up(tensor.offset + tensor.count, static_cast<std::size_t>(unit_multiple)));
  return size;
}

ParameterStore::ParameterStore(std::vector<ParameterTensor> tensors, Allocator& allocator,
                               const ParameterPlan& plan, const Precision& precision)
    : tensors_(std::move(tensors)), unit_multiple_(plan.unit_multiple),
      size_(store_size(tensors_, unit_multiple_)), precision_(precision) {
  if (plan.hold_values) values_ = allocator.allocate_elements(MemoryState::params, size_, precision_.param);
  if (plan.hold_grads) grads_ = allocator.allocate_elements(MemoryState::grads, size_, precision_.reduce);
  // The padding is never trained, but it is summed and gathered: keep it finite.
  values_.fill_zero();
}

namespace {
void reallocate(Buffer& buffer, std::size_t bytes, const std::function<Buffer(std::size_t bytes)>& allocate) {
  buffer.reset();
  buffer = allocate(bytes);
  if (buffer.bytes() != bytes) throw std::invalid_argument("replacement parameter buffer of the wrong size");
}
}  // namespace

void ParameterStore::reallocate_values(const std::function<Buffer(std::size_t bytes)>& allocate) {
  reallocate(values_, size_ * precision_.param_bytes(), allocate);
  values_.fill_zero();
}

void ParameterStore::reallocate_grads(const std::function<Buffer(std::size_t bytes)>& allocate) {
  reallocate(grads_, size_ * precision_.reduce_bytes(), allocate);
}

const ParameterTensor& ParameterStore::tensor(const std::string& path) const {
  for (const auto& tensor : tensors_)
    if (tensor.path == path) return tensor;
  throw std::out_of_range("no parameter " + path);
}

FlatRange unit_range(const std::vector<ParameterTensor>& tensors, int layer, int unit_multiple) {
  std::size_t begin = SIZE_MAX, end = 0;
  for (const auto& tensor : tensors) {
    if (tensor.layer != layer) continue;
    begin = std::min(begin, tensor.offset);
    end = std::max(end, tensor.offset + tensor.count);
  }
  if (end < begin) throw std::out_of_range("no parameters for layer " + std::to_string(layer));
  return {begin, round_up(end, static_cast<std::size_t>(unit_multiple)) - begin};
}

std::vector<ReplicaSegment> replica_segments(const std::vector<ParameterTensor>& tensors, int layer,
                                             int unit_multiple, const GridShape& shape) {
  const FlatRange unit = unit_range(tensors, layer, unit_multiple);
  std::vector<ReplicaSegment> segments;
  for (const ParameterTensor& tensor : tensors) {
    if (tensor.layer != layer) continue;
    const GroupKind group = tensor.replica_group(shape);
    if (!segments.empty() && segments.back().group == group) continue;
    if (!segments.empty()) segments.back().range.count = tensor.offset - segments.back().range.offset;
    segments.push_back({{tensor.offset, 0}, group});
  }
  segments.back().range.count = unit.offset + unit.count - segments.back().range.offset;
  return segments;
}

RangeCopies ParameterStore::copies_of(const ParameterTensor& tensor, const GridShape& shape,
                                   const GridCoordinates& place) {
  RangeCopies copies;
  if (tensor.replicated_over_data) {
    // Experts split over an EP group have dp/ep replicas, told apart by expert_replica.
    const bool by_expert = tensor.replica_group(shape) == GroupKind::expert_data;
    copies = by_expert ? RangeCopies{place.expert_replica, shape.dp / shape.ep} : RangeCopies{place.dp, shape.dp};
  }
  if (tensor.replicated_over_tensor) copies = copies.within(place.tp, shape.tp);
  return copies;
}

}  // namespace mlptrain
