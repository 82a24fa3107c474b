// ZeRO's unit layout (see zero_units.hpp).
#include "strategies/zero_units.hpp"

#include <algorithm>
#include <stdexcept>

namespace mlptrain {

namespace {

std::size_t offset_of(const std::vector<ParameterTensor>& tensors, const std::string& path) {
  for (const ParameterTensor& tensor : tensors)
    if (tensor.path == path) return tensor.offset;
  throw std::out_of_range("no parameter " + path);
}

}  // namespace

ZeroLayout zero_layout(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                       const std::vector<LayerSpec>& model, LayerRange layers, bool recompute,
                       const GridShape& shape) {
  ZeroLayout layout;
  const auto ranks = static_cast<std::size_t>(shape.dp);
  for (int layer = layers.first; layer < layers.last; ++layer) {
    const LayerSpec& spec = model[static_cast<std::size_t>(layer)];
    const FlatRange full = unit_range(tensors, layer, unit_multiple);
    if (spec.moe()) {
      layout.units.push_back({.layer = layer, .moe = true, .full = full});
      for (const ReplicaSegment& segment : replica_segments(tensors, layer, unit_multiple, shape))
        if (group_size(shape, segment.group) > 1)
          layout.whole_segments.push_back({layer, segment.range, segment.group});
      for (const ParameterTensor& tensor : tensors)
        if (tensor.layer == layer) layout.whole_elements += tensor.count;
      continue;
    }
    const std::string base = layer_path(layer, static_cast<int>(model.size()));
    // Recomputation drops (and so runs again) exactly the GELU layers' pre-activations.
    layout.units.push_back({.layer = layer,
                            .recomputed = recompute && spec.gelu,
                            .full = full,
                            .shard_size = full.count / ranks,
                            .shard_offset = layout.shard_total,
                            .weight_at = offset_of(tensors, base + "/weight") - full.offset,
                            .bias_at = offset_of(tensors, base + "/bias") - full.offset});
    layout.shard_total += full.count / ranks;
    layout.largest_unit = std::max(layout.largest_unit, full.count);
    layout.padded_total += full.count;
  }
  return layout;
}

}  // namespace mlptrain
