// A rank's layout (see rank_layout.hpp).
#include "cost/rank_layout.hpp"

#include <stdexcept>

namespace mlptrain {

LayerSpec RankLayout::local_spec(int layer) const {
  LayerSpec spec = model.at(static_cast<std::size_t>(layer));
  if (spec.moe()) return spec;  // an MoE layer's rows keep the model's width
  const std::string weight = layer_path(layer, static_cast<int>(model.size())) + "/weight";
  for (const ParameterTensor& tensor : tensors)
    if (tensor.path == weight) {
      spec.out_features = tensor.local_shape[0];
      spec.in_features = tensor.local_shape[1];
      return spec;
    }
  throw std::logic_error("layer " + std::to_string(layer) + " is not on this rank");
}

std::size_t RankLayout::store_size() const { return mlptrain::store_size(tensors, plan.unit_multiple); }

}  // namespace mlptrain
