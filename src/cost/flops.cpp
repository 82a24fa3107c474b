// A step's floating-point work (see flops.hpp).
#include "cost/flops.hpp"

#include "model/recompute_plan.hpp"

namespace mlptrain {

double model_flops_per_sample(const std::vector<LayerSpec>& model) {
  double multiply_adds = 0;
  for (const LayerSpec& layer : model) multiply_adds += static_cast<double>(layer_cost(layer));
  return 6 * multiply_adds;
}

double recompute_flops_per_sample(const std::vector<LayerSpec>& stage_layers, bool recompute) {
  const RecomputePlan plan(stage_layers, recompute);
  double multiply_adds = 0;
  for (std::size_t local = 0; local < stage_layers.size(); ++local)
    if (stage_layers[local].gelu && !plan.keeps_pre(local, true))
      multiply_adds += static_cast<double>(layer_cost(stage_layers[local]));
  return 2 * multiply_adds;
}

LayerPasses layer_passes(const LayerSpec& layer, int expert_ranks, int tensor_ranks, double expert_share) {
  const auto out = static_cast<double>(layer.out_features);
  if (!layer.moe()) return {.elementwise_forward = out, .elementwise_backward = 2 * out};
  const double assigned = expert_share * layer.top_k * out / tensor_ranks;  // a token's rows on this rank's experts
  const double regrouped = expert_ranks > 1 ? 2 * assigned : 0;
  return {.elementwise_forward = assigned,
          .elementwise_backward = 2 * assigned,
          .moved_forward = 2 * assigned + regrouped,
          .moved_backward = 3 * assigned + out + regrouped};
}

double local_multiply_adds(const LayerSpec& layer, int tensor_ranks, double expert_share) {
  if (!layer.moe()) return static_cast<double>(layer_cost(layer));
  const auto router = static_cast<double>(layer.experts * layer.in_features);
  return router + expert_share * (static_cast<double>(layer_cost(layer)) - router) / tensor_ranks;
}

}  // namespace mlptrain
