// Tensor parallelism the Megatron-LM way (Shoeybi et al., "Megatron-LM: training multi-billion
// parameter language models using model parallelism", 2019). Consecutive layers pair up:
//   column-parallel layer (even index): W split on its output dimension, so each rank computes a
//     slice of the outputs and applies GELU to it, with no communication in forward;
//   row-parallel layer (the next one): W split on its input dimension, so each rank's product is a
//     partial sum of the outputs; the partial sums are all-reduced (Megatron's g) before the bias,
//     which every rank holds whole, is added once.
// In backward the conjugates: the row-parallel layer's input gradient is already this rank's
// slice (g's backward is the identity), while the column-parallel layer's input gradient is a
// partial sum over the output slices and is all-reduced (f's backward; f's forward is the
// identity). A layer left without a partner (the last of an odd count) is replicated: every rank
// computes the same, and its gradients come out identical without communication.
#include <fmt/format.h>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

enum class Role { replicated, column, row };

Role role_of(int layer, int layer_count) {
  if (layer % 2 == 1) return Role::row;
  return layer + 1 < layer_count ? Role::column : Role::replicated;
}

// This rank's slice [begin, end) of an extent split over the group.
std::pair<std::int64_t, std::int64_t> slice(std::int64_t extent, int rank, int size) {
  return {extent * rank / size, extent * (rank + 1) / size};
}

class TensorParallel final : public Strategy {
 public:
  explicit TensorParallel(const StrategyContext& context)
      : config_(context.config), group_(context.groups.group(GroupKind::tensor)),
        layers_(context.layers), first_layer_(context.first_layer), last_layer_(context.last_layer) {}

  std::string_view name() const override { return "tensor_parallel"; }

  std::string note() const override {
    int pairs = 0, replicated = 0;
    for (int layer = 0; layer < config_.layers; ++layer) {
      pairs += role_of(layer, config_.layers) == Role::row ? 1 : 0;
      replicated += role_of(layer, config_.layers) == Role::replicated ? 1 : 0;
    }
    return fmt::format("tensor parallel over {} ranks: {} column/row layer pair(s), {} replicated "
                       "layer(s)", group_.size(), pairs, replicated);
  }

  // g: the row-parallel layer's partial products are summed before the bias.
  void after_layer_matmul(LayerEvent& event) override {
    if (role_of(event.layer, config_.layers) != Role::row) return;
    group_.all_reduce(event.pre, static_cast<std::size_t>(event.rows * event.parameters->spec.out_features));
  }

  // f's backward: the column-parallel layer's input gradient is summed over the output slices.
  void after_layer_backward(LayerEvent& event) override {
    if (role_of(event.layer, config_.layers) != Role::column || event.grad_input == nullptr) return;
    group_.all_reduce(event.grad_input,
                      static_cast<std::size_t>(event.rows * event.parameters->spec.in_features));
  }

  void predict(PlacementPrediction& prediction) const override {
    prediction.modes[0] = prediction.modes[1] = "S";
    if (prediction.modes[2] == "R") prediction.modes[2] = "S";
    // Per micro-batch: each pair's forward sum of [rows, out] and, unless the pair starts the
    // model, the backward sum of the column layer's input gradient [rows, in]. Recomputation
    // runs the forward sum again for each row layer whose pre-activation it drops (GELU's).
    const std::int64_t rows = config_.global_batch / config_.micro_batches / config_.dp;
    std::int64_t floats = 0;
    for (int index = first_layer_; index < last_layer_; ++index) {  // this rank's layers (stage)
      const LayerSpec& layer = layers_[static_cast<std::size_t>(index)];
      const Role role = role_of(layer.index, config_.layers);
      if (role == Role::row) floats += rows * layer.out_features * (config_.recompute && layer.gelu ? 2 : 1);
      if (role == Role::column && layer.index > 0) floats += rows * layer.in_features;
    }
    prediction.comm(CommOp::all_reduce) +=
        config_.micro_batches * floats * static_cast<std::int64_t>(sizeof(float));
  }

 private:
  const Config& config_;
  Communicator& group_;
  const std::vector<LayerSpec>& layers_;
  const int first_layer_;
  const int last_layer_;
};

bool wanted(const Config&, const GridShape& shape) { return shape.tp > 1; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates& place,
          ParameterPlan& plan) {
  plan.split = [layers = config.layers, rank = place.tp, size = shape.tp](ParameterTensor& tensor) {
    const Role role = role_of(tensor.layer, layers);
    const bool weight = tensor.global_shape.size() == 2;
    if (role == Role::column) {  // the output dimension: rows of W, and the bias
      const auto [begin, end] = slice(tensor.global_shape[0], rank, size);
      tensor.local_start[0] = begin;
      tensor.local_shape[0] = end - begin;
      tensor.replicated_over_tensor = false;
    } else if (role == Role::row && weight) {  // the input dimension: columns of W
      const auto [begin, end] = slice(tensor.global_shape[1], rank, size);
      tensor.local_start[1] = begin;
      tensor.local_shape[1] = end - begin;
      tensor.replicated_over_tensor = false;
    }
  };
}

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<TensorParallel>(context);
}

}  // namespace

extern const StrategyRegistration tensor_parallel_registration{"tensor_parallel", wanted, create,
                                                               plan};

}  // namespace mlptrain
