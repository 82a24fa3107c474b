// Flat parameter storage and layout-independent initialization (see parameter_store.hpp).
#include "model/parameter_store.hpp"

#include <cmath>
#include <stdexcept>


namespace mlptrain {

namespace {
std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

std::vector<ParameterTensor> dense_parameter_tensors(const std::vector<LayerSpec>& specs, int first,
                                                     int last, const ParameterPlan& plan) {
  const auto unit_multiple = static_cast<std::size_t>(plan.unit_multiple);
  const auto place = [&](ParameterTensor& tensor, std::size_t& offset) {
    if (plan.split) plan.split(tensor);
    tensor.count = 1;
    for (std::int64_t extent : tensor.local_shape) tensor.count *= static_cast<std::size_t>(extent);
    tensor.offset = offset;
    offset += tensor.count;
  };
  std::vector<ParameterTensor> tensors;
  const int layer_count = static_cast<int>(specs.size());
  std::size_t offset = 0;
  for (int layer = first; layer < last; ++layer) {
    const LayerSpec& spec = specs[layer];
    const float bound = 1.0f / std::sqrt(static_cast<float>(spec.in_features));
    const std::string base = layer_path(layer, layer_count);
    ParameterTensor weight{.path = base + "/weight",
                           .layer = layer,
                           .global_index = 2 * layer,
                           .global_shape = {spec.out_features, spec.in_features},
                           .local_start = {0, 0},
                           .local_shape = {spec.out_features, spec.in_features},
                           .init_bound = bound};
    ParameterTensor bias{.path = base + "/bias",
                         .layer = layer,
                         .global_index = 2 * layer + 1,
                         .global_shape = {spec.out_features},
                         .local_start = {0},
                         .local_shape = {spec.out_features},
                         .init_bound = bound};
    place(weight, offset);
    place(bias, offset);
    offset = round_up(offset, unit_multiple);
    tensors.push_back(std::move(weight));
    tensors.push_back(std::move(bias));
  }
  return tensors;
}

ParameterStore::ParameterStore(std::vector<ParameterTensor> tensors, Allocator& allocator,
                               const ParameterPlan& plan)
    : tensors_(std::move(tensors)), unit_multiple_(plan.unit_multiple) {
  for (const auto& tensor : tensors_)
    size_ = std::max(size_, round_up(tensor.offset + tensor.count,
                                     static_cast<std::size_t>(unit_multiple_)));
  if (plan.hold_values) values_ = allocator.allocate_floats(MemoryState::params, size_);
  if (plan.hold_grads) grads_ = allocator.allocate_floats(MemoryState::grads, size_);
  // The padding is never trained, but it is summed and gathered: keep it finite.
  if (!values_.empty()) std::fill_n(values(), size_, 0.0f);
}

namespace {
void reallocate(Buffer& buffer, std::size_t count,
                const std::function<Buffer(std::size_t bytes)>& allocate) {
  buffer.reset();
  buffer = allocate(count * sizeof(float));
  if (buffer.bytes() != count * sizeof(float))
    throw std::invalid_argument("replacement parameter buffer of the wrong size");
}
}  // namespace

void ParameterStore::reallocate_values(const std::function<Buffer(std::size_t bytes)>& allocate) {
  reallocate(values_, size_, allocate);
  std::fill_n(values(), size_, 0.0f);
}

void ParameterStore::reallocate_grads(const std::function<Buffer(std::size_t bytes)>& allocate) {
  reallocate(grads_, size_, allocate);
}

const ParameterTensor& ParameterStore::tensor(const std::string& path) const {
  for (const auto& tensor : tensors_)
    if (tensor.path == path) return tensor;
  throw std::out_of_range("no parameter " + path);
}

FlatRange ParameterStore::unit_range(int layer) const {
  std::size_t begin = size_, end = 0;
  for (const auto& tensor : tensors_) {
    if (tensor.layer != layer) continue;
    begin = std::min(begin, tensor.offset);
    end = std::max(end, tensor.offset + tensor.count);
  }
  if (end < begin) throw std::out_of_range("no parameters for layer " + std::to_string(layer));
  return {begin, round_up(end, static_cast<std::size_t>(unit_multiple_)) - begin};
}

bool ParameterStore::owns(const ParameterTensor& tensor, const GridShape& shape,
                          const GridCoordinates& place) {
  if (tensor.replicated_over_data && place.dp != tensor.global_index % shape.dp) return false;
  if (tensor.replicated_over_tensor && place.tp != tensor.global_index % shape.tp) return false;
  return true;
}

}  // namespace mlptrain
