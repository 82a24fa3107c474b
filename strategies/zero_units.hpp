// ZeRO's units as the layout gives them (see zero.cpp): each dense layer's padded range of the
// store is a unit split into N equal shards over the data-parallel group, rank r owning shard r;
// MoE layers stay whole, their gradients summed per replica segment. Pure: the strategy works on
// this layout and the cost model counts it, so the two cannot disagree.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/process_grid.hpp"
#include "cost/prediction.hpp"
#include "cost/rank_layout.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"
#include "schedule/schedule.hpp"

namespace mlptrain {

struct ZeroUnit {
  int layer = 0;
  bool moe = false;              // kept whole: nothing below applies
  bool recomputed = false;       // --recompute runs its forward again in backward
  FlatRange full;                // padded range in the store's layout
  std::size_t shard_size = 0;    // full.count / N
  std::size_t shard_offset = 0;  // where this unit's shard sits in the shard buffers
  std::size_t weight_at = 0;     // the weight's and the bias's places within the unit
  std::size_t bias_at = 0;
};

// An MoE layer's piece summed over one replica group of more than one rank.
struct WholeSegment {
  int layer = 0;
  FlatRange range;
  GroupKind group = GroupKind::data;
};

struct ZeroLayout {
  std::vector<ZeroUnit> units;  // one per local layer, in order
  std::vector<WholeSegment> whole_segments;
  std::size_t shard_total = 0;     // elements of this rank's shards over every unit
  std::size_t largest_unit = 0;    // elements of the largest unit
  std::size_t padded_total = 0;    // elements of every sharded unit, padding included
  std::size_t whole_elements = 0;  // elements of the MoE layers' tensors (their moments stay whole)
};

ZeroLayout zero_layout(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                       const std::vector<LayerSpec>& model, LayerRange layers, bool recompute,
                       const GridShape& shape);

// ZeRO's terms of the cost model (placement by state, bytes by collective) and its sentence for
// the start of the run, both from the layout above.
void zero_predict(const RankLayout& layout, Prediction& prediction);
std::string zero_describe(const RankLayout& layout);

}  // namespace mlptrain
