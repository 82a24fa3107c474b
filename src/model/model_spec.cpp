// Model shape helpers (see model_spec.hpp).
#include "model/model_spec.hpp"

#include <algorithm>

namespace mlptrain {

std::vector<LayerSpec> model_layer_specs(int layers, std::int64_t input_dim, std::int64_t hidden,
                                         std::int64_t output_dim, int moe_every, int experts,
                                         int top_k) {
  std::vector<LayerSpec> specs;
  for (int index = 0; index < layers; ++index) {
    const bool last = index == layers - 1;
    const bool moe = moe_every > 0 && index > 0 && !last && index % moe_every == 0;
    specs.push_back({.index = index,
                     .in_features = index == 0 ? input_dim : hidden,
                     .out_features = last ? output_dim : hidden,
                     .gelu = !last && !moe,
                     .experts = moe ? experts : 0,
                     .top_k = moe ? top_k : 0});
  }
  return specs;
}

std::string layer_path(int layer, int layer_count) {
  const std::size_t width = std::max<std::size_t>(2, std::to_string(layer_count - 1).size());
  std::string digits = std::to_string(layer);
  digits.insert(0, width - std::min(width, digits.size()), '0');
  return "layers/" + digits;
}

std::int64_t parameter_count(const LayerSpec& spec) {
  const std::int64_t linear = (spec.in_features + 1) * spec.out_features;
  return spec.moe() ? spec.experts * (spec.in_features + linear) : linear;
}

std::int64_t parameter_count(const std::vector<LayerSpec>& specs) {
  std::int64_t total = 0;
  for (const LayerSpec& spec : specs) total += parameter_count(spec);
  return total;
}

std::int64_t layer_cost(const LayerSpec& spec) {
  const std::int64_t linear = spec.in_features * spec.out_features + spec.out_features;
  return spec.moe() ? spec.experts * spec.in_features + spec.top_k * linear : linear;
}

}  // namespace mlptrain
