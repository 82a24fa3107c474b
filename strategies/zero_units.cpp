// ZeRO's unit layout and the cost-model terms and sentence it implies (see zero_units.hpp).
#include "strategies/zero_units.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

namespace mlptrain {

ZeroLayout zero_layout(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                       const std::vector<LayerSpec>& model, LayerRange layers, bool recompute,
                       const GridShape& shape) {
  ZeroLayout layout;
  for (int layer = layers.first; layer < layers.last; ++layer) {
    const LayerSpec& spec = model[static_cast<std::size_t>(layer)];
    // Recomputation drops (and so runs again) exactly the GELU layers' pre-activations.
    ZeroUnit unit{.layer = layer, .recomputed = recompute && spec.gelu, .full = unit_range(tensors, layer, unit_multiple)};
    for (const ReplicaSegment& piece : replica_segments(tensors, layer, unit_multiple, shape)) {
      const int ranks = group_size(shape, piece.group);
      if (piece.range.count % static_cast<std::size_t>(ranks) != 0)
        throw std::logic_error("ZeRO: a piece of a unit is not padded to its group");
      const std::size_t shard = piece.range.count / static_cast<std::size_t>(ranks);
      unit.segments.push_back({.range = piece.range, .group = piece.group, .ranks = ranks, .shard_size = shard,
                               .shard_offset = layout.shard_total});
      layout.shard_total += shard;
      if (ranks > 1) layout.communicated += piece.range.count;
    }
    layout.largest_unit = std::max(layout.largest_unit, unit.full.count);
    layout.units.push_back(std::move(unit));
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
  // Modes only strengthen, so that the order in which strategies predict does not matter: what
  // another strategy already split (a pipeline's stage, a tensor slice) stays split.
  if (stage == 3) prediction.params.mode = PlacementMode::sharded_gathered;
  if (stage >= 2) Prediction::shard(prediction.grads);
  Prediction::shard(prediction.optimizer);
  Prediction::shard(prediction.activations);
  // The shards (the unit buffers in flight are comm_buffers) and the optimizer state of what it
  // updates.
  if (stage >= 2) prediction.grads.bytes += bytes(zero.shard_total, reduce);
  if (stage == 3) prediction.params.bytes += bytes(zero.shard_total, param);
  prediction.optimizer.bytes = bytes(zero.shard_total, precision.optimizer_bytes());
  const std::int64_t micro_batches = layout.config.micro_batches;
  const std::int64_t reduced = bytes(zero.communicated, reduce), gathered = bytes(zero.communicated, param);
  prediction.comm(CommOp::reduce_scatter) += stage == 1 ? reduced : micro_batches * reduced;
  prediction.comm(CommOp::all_gather) += stage == 3 ? 2 * micro_batches * gathered : gathered;
  // Stage 3 gathers each recomputed unit once more per micro-batch, for its second forward.
  if (stage == 3)
    for (const ZeroUnit& unit : zero.units)
      if (unit.recomputed)
        for (const ZeroSegment& piece : unit.segments)
          if (piece.ranks > 1) prediction.comm(CommOp::all_gather) += micro_batches * bytes(piece.range.count, param);
}

std::string zero_describe(const RankLayout& layout) {
  const int stage = layout.config.zero, ranks = layout.shape.dp;
  if (ranks == 1)
    return fmt::format("ZeRO stage {} on a data-parallel group of one rank: nothing is sharded", stage);
  return fmt::format("ZeRO stage {}: optimizer state{}{} sharded over {} ranks", stage,
                     stage >= 2 ? ", gradients" : "", stage == 3 ? ", parameters" : "", ranks);
}

}  // namespace mlptrain
