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
// computes the same, and its gradients come out identical without communication. The sums carry
// the activations' type (the param type).
#include <fmt/format.h>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

enum class PairPart { replicated, column, row };  // a layer's part in the pairs

PairPart part_of(int layer, int layer_count) {
  if (layer % 2 == 1) return PairPart::row;
  return layer + 1 < layer_count ? PairPart::column : PairPart::replicated;
}

// This rank's slice [begin, end) of an extent split over the group.
std::pair<std::int64_t, std::int64_t> slice(std::int64_t extent, int rank, int size) {
  return {extent * rank / size, extent * (rank + 1) / size};
}

class TensorParallel final : public Strategy, public LayerHooks {
 public:
  explicit TensorParallel(const StrategyContext& context)
      : layer_count_(context.config.layers), group_(context.groups.group(GroupKind::tensor)) {}

  // g: the row-parallel layer's partial products are summed before the bias.
  void after_layer_matmul(LayerEvent& event) override {
    if (part_of(event.layer, layer_count_) != PairPart::row) return;
    group_.all_reduce(event.pre, static_cast<std::size_t>(event.layer_rows * event.parameters->spec.out_features),
                      event.activation_type);
  }

  // f's backward: the column-parallel layer's input gradient is summed over the output slices.
  void after_layer_backward(LayerEvent& event) override {
    if (part_of(event.layer, layer_count_) != PairPart::column || event.layer_grad_input == nullptr) return;
    group_.all_reduce(event.layer_grad_input,
                      static_cast<std::size_t>(event.layer_rows * event.parameters->spec.in_features),
                      event.activation_type);
  }

 private:
  const int layer_count_;
  Communicator& group_;
};

bool wanted(const Config&, const GridShape& shape) { return shape.tp > 1; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates& place,
          ParameterPlan& plan) {
  plan.splits.push_back([layers = config.layers, rank = place.tp, size = shape.tp](ParameterTensor& tensor) {
    const PairPart part = part_of(tensor.layer, layers);
    const bool weight = tensor.global_shape.size() == 2;
    if (part == PairPart::column) {  // the output dimension: rows of W, and the bias
      const auto [begin, end] = slice(tensor.global_shape[0], rank, size);
      tensor.local_start[0] = begin;
      tensor.local_shape[0] = end - begin;
      tensor.replicated_over_tensor = false;
    } else if (part == PairPart::row && weight) {  // the input dimension: columns of W
      const auto [begin, end] = slice(tensor.global_shape[1], rank, size);
      tensor.local_start[1] = begin;
      tensor.local_shape[1] = end - begin;
      tensor.replicated_over_tensor = false;
    }
  });
}

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<TensorParallel>(context);
}

void predict(const RankLayout& layout, Prediction& prediction) {
  const Config& config = layout.config;
  prediction.params.mode = prediction.grads.mode = PlacementMode::sharded;
  Prediction::shard(prediction.optimizer);
  // Per micro-batch: each pair's forward sum of [rows, out] and, unless the pair starts the
  // model, the backward sum of the column layer's input gradient [rows, in]. Recomputation runs
  // the forward sum again for each row layer whose pre-activation it drops (GELU's).
  std::int64_t elements = 0;
  for (int index = layout.layers.first; index < layout.layers.last; ++index) {  // this rank's layers
    const LayerSpec& layer = layout.model[static_cast<std::size_t>(index)];
    const PairPart part = part_of(layer.index, config.layers);
    if (part == PairPart::row) elements += layout.rows * layer.out_features * (config.recompute && layer.gelu ? 2 : 1);
    if (part == PairPart::column && layer.index > 0) elements += layout.rows * layer.in_features;
  }
  prediction.comm(CommOp::all_reduce) +=
      config.micro_batches * elements * static_cast<std::int64_t>(size_of(config.param_dtype));
}

std::string describe(const RankLayout& layout) {
  int pairs = 0, replicated = 0;
  for (int layer = 0; layer < layout.config.layers; ++layer) {
    pairs += part_of(layer, layout.config.layers) == PairPart::row ? 1 : 0;
    replicated += part_of(layer, layout.config.layers) == PairPart::replicated ? 1 : 0;
  }
  return fmt::format("tensor parallel over {} ranks: {} column/row layer pair(s), {} replicated layer(s)",
                     layout.shape.tp, pairs, replicated);
}

constexpr Role roles[] = {Role::splits_tensors};
// The gradient reductions start (without blocking) at the end of a layer's backward before this
// strategy's blocking sum of the input gradient, so that they overlap it.
constexpr std::string_view runs_after[] = {"data_parallel", "zero"};

}  // namespace

extern const StrategyRegistration tensor_parallel_registration{.name = "tensor_parallel",
                                                               .roles = roles,
                                                               .runs_after = runs_after,
                                                               .wanted = wanted,
                                                               .create = create,
                                                               .plan = plan,
                                                               .predict = predict,
                                                               .describe = describe};

}  // namespace mlptrain
