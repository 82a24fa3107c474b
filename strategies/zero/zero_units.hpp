// ZeRO's units as the layout gives them (see zero.cpp): each layer's padded range of the store is
// a unit, cut into pieces by the group that holds replicas of them, each piece split into equal
// shards over its group, rank r of the group owning shard r. Pure: the strategy works on this
// layout and the cost model counts it, so the two cannot disagree.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/precision.hpp"
#include "core/process_grid.hpp"
#include "cost/prediction.hpp"
#include "cost/rank_layout.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"
#include "schedule/schedule.hpp"

namespace mlptrain {

// A piece of a unit summed and sharded over one group: a dense layer's whole unit over the
// data-parallel group; an MoE layer's router over that group and its experts over the ranks that
// hold the same experts (the edp group). The store pads each piece to a multiple of the group.
// Under hybrid sharding the piece is sharded over a shard group cut from that group, and each
// shard, once reduced there, is summed across the replica group of the ranks that hold it.
struct ZeroSegment {
  FlatRange range;  // in the store's layout
  GroupKind group = GroupKind::data;
  int ranks = 1;                 // the group's size (1: nothing to share, the shard is the piece)
  GroupKind across = GroupKind::world;  // the replica group (hybrid sharding only)
  int replicas = 1;                     // its size (1: the shard is held once)
  std::size_t shard_size = 0;    // range.count / ranks
  std::size_t shard_offset = 0;  // where this piece's shard sits in the shard buffers
};

struct ZeroUnit {
  int layer = 0;
  bool recomputed = false;  // --recompute runs its forward again in backward
  FlatRange full;           // padded range in the store's layout
  std::vector<ZeroSegment> segments;
  // Stage 3 with --fp8 tensorwise: a dense layer's weight (from the unit's start), gathered as
  // fp8 bytes with the weight's scale (count 0: the unit is gathered in the param type).
  FlatRange fp8_weight;
};

// A unit gathered in fp8 (§2.7): each rank's block of the gathered bytes holds a byte for every
// element of its shard (the weight's codes; unused where the shard is not weight), then, 8-byte
// aligned, the shard's other elements (bias, padding) in the param type, in order. The weight's
// elements are rounded as the forward's tensorwise quantization rounds them, so gathering them
// in fp8 moves half of bf16's bytes and changes no product.
struct Fp8Wire {
  std::size_t shard = 0;        // elements of a rank's shard
  std::size_t other_slots = 0;  // of which at most this many are not weight
  std::size_t codes_bytes() const { return (shard + 7) / 8 * 8; }
  std::size_t block_bytes(std::size_t param_bytes) const { return codes_bytes() + other_slots * param_bytes; }
};
Fp8Wire fp8_wire(const ZeroUnit& unit);

struct ZeroLayout {
  std::vector<ZeroUnit> units;  // one per local layer, in order
  std::size_t shard_total = 0;  // elements of this rank's shards over every unit
  std::size_t largest_unit = 0;  // elements of the largest unit
};

// A stage-3 slot of one gathered unit: its values, and its gradients after them (at
// `grads_offset` bytes) when the reduce type differs from the param type, else in place.
// Gradients and the next slot start on 256-byte boundaries: fp32 gradients after an odd number
// of bf16 values would be misaligned (and slower on any device).
struct ZeroSlotLayout {
  std::size_t grads_offset = 0;
  std::size_t bytes = 0;
};
ZeroSlotLayout zero_slot_layout(const ZeroLayout& layout, const Precision& precision);

// `fp8_gathers`: stage 3 with --fp8 tensorwise, whose dense units gather their weights in fp8.
ZeroLayout zero_layout(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                       const std::vector<LayerSpec>& model, const RankLayers& layers, bool recompute,
                       const GridShape& shape, bool fp8_gathers);
bool zero_fp8_gathers(const Config& config);

// ZeRO's terms of the cost model (placement by state, bytes by collective) and its sentence for
// the start of the run, both from the layout above.
void zero_predict(const RankLayout& layout, Prediction& prediction);
std::string zero_describe(const RankLayout& layout);

}  // namespace mlptrain
