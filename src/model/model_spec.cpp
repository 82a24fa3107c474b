// Model shape helpers (see model_spec.hpp).
#include "model/model_spec.hpp"

#include <algorithm>

namespace mlptrain {

std::vector<LayerSpec> dense_layer_specs(int layers, std::int64_t input_dim, std::int64_t hidden,
                                         std::int64_t output_dim) {
  std::vector<LayerSpec> specs;
  for (int index = 0; index < layers; ++index) {
    const bool last = index == layers - 1;
    specs.push_back({.index = index,
                     .in_features = index == 0 ? input_dim : hidden,
                     .out_features = last ? output_dim : hidden,
                     .gelu = !last});
  }
  return specs;
}

std::string layer_path(int layer, int layer_count) {
  const std::size_t width = std::max<std::size_t>(2, std::to_string(layer_count - 1).size());
  std::string digits = std::to_string(layer);
  digits.insert(0, width - std::min(width, digits.size()), '0');
  return "layers/" + digits;
}

std::int64_t parameter_count(const std::vector<LayerSpec>& specs) {
  std::int64_t total = 0;
  for (const LayerSpec& spec : specs) total += (spec.in_features + 1) * spec.out_features;
  return total;
}

}  // namespace mlptrain
