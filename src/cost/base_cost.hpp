// The cost model's terms that every layout has, whatever strategies take part: the parameter
// values and gradients the store holds, the AdamW moments of what the rank updates, the
// activations its schedule keeps alive at once (following the runner's allocations layer by
// layer, with the recomputation plan), the tensors it sends and receives across pipeline stage
// boundaries, and the loop's world sums. Strategies add their own terms after these, and
// finish_prediction applies what the run's options say of the modes.
#pragma once

#include <cstdint>

#include "cost/prediction.hpp"
#include "cost/rank_layout.hpp"

namespace mlptrain {

// What a run has seen of its MoE routing (the routing decides how many rows reach the experts):
// nothing yet predicts balanced routing, or the imbalance a plan is given.
struct RoutingSeen {
  // Per model chunk: the most a training micro-batch's MoE layers kept (empty, or 0 for a
  // chunk: predicted from the layers' shapes).
  std::vector<std::int64_t> largest_moe_activation_bytes;
  // Where nothing was seen: the rows of a rank's share of a layer's experts over the balanced
  // share (mlpplan's --expert-peak-imbalance, the busiest rank's), which its activations follow.
  double expert_peak_imbalance = 1.0;
};

// The activation bytes one training micro-batch of the rank's model chunk `chunk` allocates and frees.
ActivationProfile activation_profile(const RankLayout& layout, const RoutingSeen& routing = {}, int chunk = 0);

// Doubles in the loop's world sum of a step: loss, correct predictions, squared gradient norm,
// read failures, the time waited for samples, ranks still writing a checkpoint, ranks that got a
// stop signal, and with MoE layers the auxiliary loss, dropped assignments and every expert's
// load of every MoE layer.
std::int64_t step_sum_values(const RankLayout& layout);

Prediction base_prediction(const RankLayout& layout, const RoutingSeen& routing = {});
// Recomputed activations are materialized again; offloaded optimizer state is in host memory.
void finish_prediction(const RankLayout& layout, Prediction& prediction);

}  // namespace mlptrain
