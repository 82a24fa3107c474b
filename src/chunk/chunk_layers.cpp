// A model chunk's layers and their placement (see chunk_layers.hpp).
#include "chunk/chunk_layers.hpp"

namespace mlptrain {

ChunkLayers::ChunkLayers(const ParameterStore& parameters, const std::vector<LayerSpec>& specs, LayerRange chunk,
                         const MoeSettings& moe)
    : precision_(parameters.precision()), first_(chunk.first), last_(chunk.last),
      model_layers_(static_cast<int>(specs.size())) {
  for (int layer = chunk.first; layer < chunk.last; ++layer) {
    const LayerSpec& spec = specs[static_cast<std::size_t>(layer)];
    const std::string path = layer_path(layer, model_layers_);
    const std::size_t unit = parameters.unit_range(layer).offset;
    StoreUnit place{.values = parameters.value_at(unit), .grads = parameters.grad_at(unit)};
    if (spec.moe()) {
      views_.push_back(LinearLayer{.spec = spec, .precision = parameters.precision()});
      moe_layers_.emplace_back(MoeLayer(parameters, spec, path, moe));
    } else {
      views_.push_back(linear_layer_view(parameters, spec, path));
      moe_layers_.emplace_back(std::nullopt);
      place.weight_at = parameters.tensor(path + "/weight").offset - unit;
      place.bias_at = parameters.tensor(path + "/bias").offset - unit;
    }
    units_.push_back(place);
  }
}

std::vector<LayerSpec> ChunkLayers::specs() const {
  std::vector<LayerSpec> specs;
  for (const LinearLayer& view : views_) specs.push_back(view.spec);
  return specs;
}

UnitMemory ChunkLayers::unit(std::size_t local, bool accumulate_grads) const {
  return {.values = units_[local].values, .grads = units_[local].grads, .accumulate_grads = accumulate_grads};
}

ChunkLayers::Placed ChunkLayers::place(std::size_t local, const UnitMemory& unit) const {
  Placed placed{.linear = views_[local]};
  if (moe_layers_[local]) {
    placed.moe = moe_layers_[local]->bind(unit.values, unit.grads);
    return placed;
  }
  LinearLayer& view = placed.linear;
  const Precision precision = view.precision;
  view.weight = advance(unit.values, units_[local].weight_at, precision.param);
  view.bias = advance(unit.values, units_[local].bias_at, precision.param);
  view.weight_grad = advance(unit.grads, units_[local].weight_at, precision.reduce);
  view.bias_grad = advance(unit.grads, units_[local].bias_at, precision.reduce);
  return placed;
}

}  // namespace mlptrain
