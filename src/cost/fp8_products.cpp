// The fp8 products of a step (see fp8_products.hpp).
#include "cost/fp8_products.hpp"

#include <vector>

#include "model/recompute_plan.hpp"

namespace mlptrain {

void for_each_fp8_product(const RankLayout& layout, const std::function<void(const Fp8ProductRun&)>& visit) {
  if (!layout.config.precision.types().fp8_gemms()) return;
  for (const Action& action : layout.schedule) {
    const bool forward = action.kind == ActionKind::forward;
    const bool input_part = action.kind == ActionKind::backward || action.kind == ActionKind::backward_input;
    const bool weight_part = action.kind == ActionKind::backward || action.kind == ActionKind::backward_weight;
    if (!forward && !input_part && !weight_part) continue;
    const LayerRange chunk = layout.layers.chunks[static_cast<std::size_t>(action.chunk)];
    std::vector<LayerSpec> specs;
    for (int layer = chunk.first; layer < chunk.last; ++layer) specs.push_back(layout.local_spec(layer));
    const RecomputePlan recompute(specs, layout.config.training.recompute);
    for (int layer = chunk.first; layer < chunk.last; ++layer) {
      const std::size_t in_chunk = static_cast<std::size_t>(layer - chunk.first);
      const LayerSpec& spec = specs[in_chunk];
      if (spec.moe()) continue;  // an MoE layer's experts compute in the param type
      const int local = layout.layers.local_index(layer);
      const std::int64_t rows = local == 0 ? layout.rows : layout.layer_output_rows(static_cast<std::size_t>(local - 1));
      const auto run = [&](LinearProduct product, bool codes_weight) {
        visit({layer, spec, product, rows, codes_weight, layer > 0});
      };
      if (forward) run(LinearProduct::forward, action.micro_batch == 0);
      // Backward's B first recomputes the forward of a layer whose pre-activation forward dropped.
      if (input_part && !recompute.keeps_pre(in_chunk, true)) run(LinearProduct::forward, false);
      if (input_part && layer > 0) run(LinearProduct::input_gradient, false);
      if (weight_part) run(LinearProduct::weight_gradient, false);
    }
  }
}

}  // namespace mlptrain
