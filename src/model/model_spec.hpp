// The shape of the model of DESIGN.md §2.1: L Linear layers, input -> hidden -> ... -> output, an
// exact GELU after every layer but the last.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mlptrain {

struct LayerSpec {
  int index = 0;
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool gelu = true;
};

std::vector<LayerSpec> dense_layer_specs(int layers, std::int64_t input_dim, std::int64_t hidden,
                                         std::int64_t output_dim);

// "layers/03": a layer's path under /model in checkpoints, zero-padded to at least two digits.
std::string layer_path(int layer, int layer_count);

// Parameters of the whole model (weights and biases), however a layout splits them.
std::int64_t parameter_count(const std::vector<LayerSpec>& specs);

}  // namespace mlptrain
