// Tensor parallelism the Megatron-LM way (Shoeybi et al., "Megatron-LM: training multi-billion
// parameter language models using model parallelism", 2019). Consecutive dense layers pair up
// (within each run of dense layers between MoE layers):
//   column-parallel layer (the first of a pair): W split on its output dimension, so each rank computes a
//     slice of the outputs and applies GELU to it, with no communication in forward;
//   row-parallel layer (the next one): W split on its input dimension, so each rank's product is a
//     partial sum of the outputs; the partial sums are all-reduced (Megatron's g) before the bias,
//     which every rank holds whole, is added once.
// In backward the conjugates: the row-parallel layer's input gradient is already this rank's
// slice (g's backward is the identity), while the column-parallel layer's input gradient is a
// partial sum over the output slices and is all-reduced (f's backward; f's forward is the
// identity). A layer left without a partner (the last of an odd count) is replicated: every rank
// computes the same, and its gradients come out identical without communication. An MoE layer
// (whose input every rank holds whole) splits its experts: each tensor rank holds an equal slice
// of every expert-parallel rank's experts and computes its slice's assignments only, so its
// output is a partial sum, all-reduced once after the layer as a row-parallel layer's is, and its
// input gradient a partial sum, all-reduced as a column-parallel layer's is (the router, held
// whole, contributes its part on one rank; expert parallelism sums the router's probability
// gradients). The sums carry the activations' type (the param type).
#include <fmt/format.h>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

enum class PairPart { replicated, column, row, experts };  // a layer's part in the pairs

PairPart part_of(int layer, const std::vector<LayerSpec>& model) {
  const auto is_moe = [&](int index) { return model[static_cast<std::size_t>(index)].moe(); };
  if (is_moe(layer)) return PairPart::experts;
  int first_dense = layer;  // of this run of dense layers
  while (first_dense > 0 && !is_moe(first_dense - 1)) --first_dense;
  if ((layer - first_dense) % 2 == 1) return PairPart::row;
  return layer + 1 < static_cast<int>(model.size()) && !is_moe(layer + 1) ? PairPart::column : PairPart::replicated;
}

// This rank's slice [begin, end) of an extent split over the group.
std::pair<std::int64_t, std::int64_t> slice(std::int64_t extent, int rank, int size) {
  return {extent * rank / size, extent * (rank + 1) / size};
}

class TensorParallel final : public Strategy, public LayerHooks {
 public:
  explicit TensorParallel(const StrategyContext& context)
      : model_(context.layers), group_(context.groups.group(GroupKind::tensor)) {}

  // g: the row-parallel layer's partial products are summed before the bias.
  void after_layer_matmul(LayerEvent& event) override {
    if (part_of(event.layer, model_) != PairPart::row) return;
    group_.all_reduce(event.pre, static_cast<std::size_t>(event.layer_rows * event.parameters->spec.out_features),
                      event.activation_type);
  }

  // An MoE layer's output: the sum of its experts' slices.
  void after_layer_forward(LayerEvent& event) override {
    if (part_of(event.layer, model_) != PairPart::experts) return;
    group_.all_reduce(event.output, static_cast<std::size_t>(event.layer_rows * event.parameters->spec.out_features),
                      event.activation_type);
  }

  // f's backward: the column-parallel layer's input gradient is summed over the output slices
  // (an MoE layer's over its experts' slices).
  void after_layer_backward(LayerEvent& event) override {
    const PairPart part = part_of(event.layer, model_);
    if ((part != PairPart::column && part != PairPart::experts) || event.layer_grad_input == nullptr) return;
    group_.all_reduce(event.layer_grad_input,
                      static_cast<std::size_t>(event.layer_rows * event.parameters->spec.in_features),
                      event.activation_type);
  }

 private:
  const std::vector<LayerSpec>& model_;
  Communicator& group_;
};

bool wanted(const Config&, const GridShape& shape) { return shape.tp > 1; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates& place,
          ParameterPlan& plan) {
  const std::vector<LayerSpec> model = model_layer_specs(config.layers, 1, config.hidden, 1, config.moe_every,
                                                         config.experts, config.top_k);
  plan.splits.push_back([model, rank = place.tp, size = shape.tp](ParameterTensor& tensor) {
    const PairPart part = part_of(tensor.layer, model);
    const bool weight = tensor.global_shape.size() == 2;
    if (part == PairPart::experts) {  // the experts' slice of this rank's block (the router stays whole)
      if (!tensor.expert) return;
      tensor.local_start[0] += tensor.local_shape[0] * rank / size;
      tensor.local_shape[0] /= size;
      tensor.replicated_over_tensor = false;
    } else if (part == PairPart::column) {  // the output dimension: rows of W, and the bias
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
  Prediction::shard(prediction.params);
  Prediction::shard(prediction.grads);
  Prediction::shard(prediction.optimizer);
  // Per micro-batch: each pair's forward sum of [rows, out] and, unless the pair starts the
  // model, the backward sum of the column layer's input gradient [rows, in]. Recomputation runs
  // the forward sum again for each row layer whose pre-activation it drops (GELU's).
  // An MoE layer sums its output and its input gradient, and (in fp32) the router's probability
  // gradients [rows, E].
  std::int64_t elements = 0, float_elements = 0;
  for (int index = layout.layers.first; index < layout.layers.last; ++index) {  // this rank's layers
    const LayerSpec& layer = layout.model[static_cast<std::size_t>(index)];
    const PairPart part = part_of(layer.index, layout.model);
    if (part == PairPart::row) elements += layout.rows * layer.out_features * (config.recompute && layer.gelu ? 2 : 1);
    if (part == PairPart::column && layer.index > 0) elements += layout.rows * layer.in_features;
    if (part == PairPart::experts) {
      elements += layout.rows * (layer.out_features + layer.in_features);
      float_elements += layout.rows * layer.experts;
    }
  }
  prediction.add_comm(GroupKind::tensor, CommOp::all_reduce,
                      config.micro_batches *
                          (elements * static_cast<std::int64_t>(size_of(config.param_dtype)) + 4 * float_elements));
}

std::string describe(const RankLayout& layout) {
  int pairs = 0, replicated = 0, moe = 0;
  for (int layer = 0; layer < layout.config.layers; ++layer) {
    pairs += part_of(layer, layout.model) == PairPart::row ? 1 : 0;
    replicated += part_of(layer, layout.model) == PairPart::replicated ? 1 : 0;
    moe += part_of(layer, layout.model) == PairPart::experts ? 1 : 0;
  }
  return fmt::format("tensor parallel over {} ranks: {} column/row layer pair(s), {} replicated layer(s){}",
                     layout.shape.tp, pairs, replicated,
                     moe > 0 ? fmt::format(", {} MoE layer(s) with their experts split", moe) : "");
}

constexpr Role roles[] = {Role::splits_tensors};
// The gradient reductions start (without blocking) at the end of a layer's backward before this
// strategy's blocking sum of the input gradient, so that they overlap it.
// Its split of an MoE layer's experts narrows expert parallelism's block of them.
constexpr std::string_view runs_after[] = {"data_parallel", "expert_parallel", "zero"};

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
