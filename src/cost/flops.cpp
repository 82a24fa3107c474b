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

}  // namespace mlptrain
