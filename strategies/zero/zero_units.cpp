// ZeRO's unit layout and the cost-model terms and sentence it implies (see zero_units.hpp).
#include "strategies/zero/zero_units.hpp"

#include "strategies/zero/zero_options.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

namespace mlptrain {

bool zero_fp8_gathers(const Config& config) {
  return config.strategies.get<ZeroOptions>().stage == 3 && config.precision.types().fp8 == Fp8Recipe::tensorwise;
}

Fp8Wire fp8_wire(const ZeroUnit& unit) {
  const std::size_t shard = unit.segments.front().shard_size;
  return {.shard = shard, .other_slots = std::min(shard, unit.full.count - unit.fp8_weight.count)};
}

ZeroLayout zero_layout(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                       const std::vector<LayerSpec>& model, const RankLayers& layers, bool recompute,
                       const GridShape& shape, bool fp8_gathers) {
  ZeroLayout layout;
  for (int layer : layers.list()) {
    const LayerSpec& spec = model[static_cast<std::size_t>(layer)];
    // Recomputation drops (and so runs again) exactly the GELU layers' pre-activations.
    ZeroUnit unit{.layer = layer, .recomputed = recompute && spec.gelu, .full = unit_range(tensors, layer, unit_multiple)};
    for (const ReplicaSegment& piece : replica_segments(tensors, layer, unit_multiple, shape)) {
      const GroupKind group = sharding_group(shape, piece.group), across = shard_replica_group(shape, piece.group);
      const int ranks = group_size(shape, group);
      if (piece.range.count % static_cast<std::size_t>(ranks) != 0)
        throw std::logic_error("ZeRO: a piece of a unit is not padded to its group");
      const std::size_t shard = piece.range.count / static_cast<std::size_t>(ranks);
      unit.segments.push_back({.range = piece.range,
                               .group = group,
                               .ranks = ranks,
                               .across = across,
                               .replicas = hybrid_sharding(shape) ? group_size(shape, across) : 1,
                               .shard_size = shard,
                               .shard_offset = layout.shard_total});
      layout.shard_total += shard;
    }
    // A dense layer's one piece shared over ranks: its weight travels in fp8 (an MoE layer's
    // experts compute in the param type, and so travel in it).
    if (fp8_gathers && !spec.moe() && unit.segments.size() == 1 && unit.segments.front().ranks > 1)
      for (const ParameterTensor& tensor : tensors)
        if (tensor.layer == layer && tensor.local_shape.size() == 2)
          unit.fp8_weight = {.offset = tensor.offset - unit.full.offset, .count = tensor.count};
    layout.largest_unit = std::max(layout.largest_unit, unit.full.count);
    layout.units.push_back(std::move(unit));
  }
  return layout;
}

ZeroSlotLayout zero_slot_layout(const ZeroLayout& layout, const Precision& precision) {
  const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  ZeroSlotLayout slot;
  slot.grads_offset = precision.param == precision.reduce ? 0 : aligned(layout.largest_unit * precision.param_bytes());
  slot.bytes = aligned(slot.grads_offset +
                       layout.largest_unit * std::max(precision.param_bytes(), precision.reduce_bytes()));
  return slot;
}

void zero_predict(const RankLayout& layout, Prediction& prediction) {
  const int stage = layout.config.strategies.get<ZeroOptions>().stage;
  const ZeroLayout zero = zero_layout(layout.tensors, layout.plan.unit_multiple, layout.model, layout.layers,
                                      layout.config.training.recompute, layout.shape, zero_fp8_gathers(layout.config));
  const Precision precision = layout.config.precision.types();
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
  // The fixed pools the collectives work on: two unit gradient buffers in stage 2, two slots of
  // a gathered unit (with its gradients after the values when their types differ) in stage 3.
  if (stage == 2) prediction.comm_buffers.bytes += bytes(2 * zero.largest_unit, reduce);
  if (stage == 3) prediction.comm_buffers.bytes += static_cast<std::int64_t>(2 * zero_slot_layout(zero, precision).bytes);
  const std::int64_t micro_batches = layout.config.data.micro_batches;
  for (const ZeroUnit& unit : zero.units)
    for (const ZeroSegment& piece : unit.segments) {
      if (piece.ranks == 1) continue;
      const std::int64_t reduced = bytes(piece.range.count, reduce), gathered = bytes(piece.range.count, param);
      prediction.add_comm(piece.group, CommOp::reduce_scatter, stage == 1 ? reduced : micro_batches * reduced);
      // Stage 3 gathers a unit for forward and for backward, and a recomputed unit once more for
      // its second forward; stages 1 and 2 once after the update.
      const std::int64_t uses = stage < 3 ? 1 : micro_batches * (unit.recomputed ? 3 : 2);
      if (unit.fp8_weight.count == 0) {
        prediction.add_comm(piece.group, CommOp::all_gather, uses * gathered);
        continue;
      }
      // In fp8: each rank's block of bytes, after an all-reduce of the weight's amax (fp32).
      prediction.add_comm(piece.group, CommOp::all_gather,
                          uses * piece.ranks * static_cast<std::int64_t>(fp8_wire(unit).block_bytes(param)));
      prediction.add_comm(piece.group, CommOp::all_reduce, uses * static_cast<std::int64_t>(sizeof(float)));
    }
  // Hybrid sharding sums each reduced shard across its replicas once a step.
  for (const ZeroUnit& unit : zero.units)
    for (const ZeroSegment& piece : unit.segments)
      if (piece.replicas > 1) prediction.add_comm(piece.across, CommOp::all_reduce, bytes(piece.shard_size, reduce));
}

std::string zero_describe(const RankLayout& layout) {
  const int stage = layout.config.strategies.get<ZeroOptions>().stage, ranks = shard_ranks(layout.shape);
  if (ranks == 1 && !hybrid_sharding(layout.shape))
    return fmt::format("ZeRO stage {} on a data-parallel group of one rank: nothing is sharded", stage);
  std::string sentence = fmt::format("ZeRO stage {}: optimizer state{}{} sharded over {} ranks", stage,
                                     stage >= 2 ? ", gradients" : "", stage == 3 ? ", parameters" : "", ranks);
  if (zero_fp8_gathers(layout.config)) sentence += "; dense layers' weights gathered as fp8 bytes (--fp8 tensorwise)";
  if (hybrid_sharding(layout.shape))
    sentence += fmt::format(" (hybrid: groups of {} consecutive data-parallel ranks, each shard replicated over {} "
                            "groups and its gradients summed across them once a step)",
                            ranks, layout.shape.dp / ranks);
  return sentence;
}

}  // namespace mlptrain
