// The shape of the model of DESIGN.md §2.1: L layers, input -> hidden -> ... -> output. Linear
// layers have an exact GELU after every one but the last; with --moe-every K, every K-th hidden
// layer is a mixture of experts instead (a router and E Linear+GELU experts, see moe.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mlptrain {

struct LayerSpec {
  int index = 0;
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool gelu = true;  // a GELU after the layer (an MoE layer's experts have their own inside)
  int experts = 0;   // > 0: an MoE layer of this many experts (in = out = hidden)
  int top_k = 0;     // experts each token goes to (MoE layers)

  bool moe() const { return experts > 0; }
};

// Layer `index` (1..L-2 counting from 1) is MoE when `moe_every` > 0 divides it.
std::vector<LayerSpec> model_layer_specs(int layers, std::int64_t input_dim, std::int64_t hidden,
                                         std::int64_t output_dim, int moe_every = 0,
                                         int experts = 0, int top_k = 0);

// "layers/03": a layer's path under /model in checkpoints, zero-padded to at least two digits.
std::string layer_path(int layer, int layer_count);

// Parameters of one layer and of the whole model, however a layout splits them.
std::int64_t parameter_count(const LayerSpec& spec);
std::int64_t parameter_count(const std::vector<LayerSpec>& specs);

// Multiply-adds per sample of a layer's forward (what balances pipeline stages): an MoE layer's
// router plus the top-k experts each token visits.
std::int64_t layer_cost(const LayerSpec& spec);

}  // namespace mlptrain
