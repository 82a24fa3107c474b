// ZeRO's unit layout and the cost-model terms and sentence it implies (see zero_units.hpp).
#include "strategies/zero_units.hpp"

#include <algorithm>
#include <fmt/format.h>
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

void zero_predict(const RankLayout& layout, Prediction& prediction) {
  const int stage = layout.config.zero;
  const ZeroLayout zero = zero_layout(layout.tensors, layout.plan.unit_multiple, layout.model, layout.layers,
                                      layout.config.recompute, layout.shape);
  const Precision precision = layout.config.precision();
  const auto bytes = [](std::size_t count, std::size_t element_bytes) {
    return static_cast<std::int64_t>(count * element_bytes);
  };
  const std::size_t param = precision.param_bytes(), reduce = precision.reduce_bytes();
  prediction.params.mode = stage == 3 ? PlacementMode::sharded_gathered : PlacementMode::replicated;
  prediction.grads.mode = stage >= 2 ? PlacementMode::sharded : PlacementMode::replicated;
  prediction.optimizer.mode = prediction.activations.mode = PlacementMode::sharded;
  // The shards (the unit buffers in flight are comm_buffers) and the optimizer state of what it
  // updates.
  if (stage >= 2) prediction.grads.bytes += bytes(zero.shard_total, reduce);
  if (stage == 3) prediction.params.bytes += bytes(zero.shard_total, param);
  prediction.optimizer.bytes = bytes(zero.shard_total + zero.whole_elements, precision.optimizer_bytes());
  for (const WholeSegment& segment : zero.whole_segments)
    prediction.comm(CommOp::all_reduce) += bytes(segment.range.count, reduce);
  if (layout.shape.dp == 1) return;
  const std::int64_t micro_batches = layout.config.micro_batches;
  const std::int64_t reduced = bytes(zero.padded_total, reduce), gathered = bytes(zero.padded_total, param);
  prediction.comm(CommOp::reduce_scatter) += stage == 1 ? reduced : micro_batches * reduced;
  prediction.comm(CommOp::all_gather) += stage == 3 ? 2 * micro_batches * gathered : gathered;
  // Stage 3 gathers each recomputed unit once more per micro-batch, for its second forward.
  if (stage == 3)
    for (const ZeroUnit& unit : zero.units)
      if (unit.recomputed) prediction.comm(CommOp::all_gather) += micro_batches * bytes(unit.full.count, param);
}

std::string zero_describe(const RankLayout& layout) {
  const int stage = layout.config.zero, ranks = layout.shape.dp;
  if (ranks == 1)
    return fmt::format("ZeRO stage {} on a data-parallel group of one rank: nothing is sharded", stage);
  return fmt::format("ZeRO stage {}: optimizer state{}{} sharded over {} ranks", stage,
                     stage >= 2 ? ", gradients" : "", stage == 3 ? ", parameters" : "", ranks);
}

}  // namespace mlptrain
