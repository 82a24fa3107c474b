// fp8 scales agreed over data-parallel replicas (--fp8 with dp > 1; DESIGN.md §2.7). A scale that
// spans rows of a micro-batch (tensorwise: every operand but the weight; rowwise: the weight
// gradient's operands, one per column) is formed from the amax of the whole global micro-batch,
// whose rows the data-parallel ranks split: each rank's amax is maximized over the data-parallel
// group before the operand is scaled. So every data-parallel layout quantizes as one process with
// the same micro-batches does, and the agreement costs an all-reduce of one float (tensorwise) or
// of a layer's widths (rowwise) per operand, beside the GEMM it scales. A weight is whole where it
// is used (replicated, or gathered by ZeRO-3), so its amax is the same on every replica already.
#include <fmt/format.h>

#include "model/recompute_plan.hpp"
#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

class Fp8AmaxAgreement final : public Strategy, public LayerHooks {
 public:
  explicit Fp8AmaxAgreement(const StrategyContext& context) : data_(context.groups.group(GroupKind::data)) {}

  void agree_operand_amax(const OperandAmax& event) override {
    data_.all_reduce(event.amax, static_cast<std::size_t>(event.count), ReduceOp::max);
  }

 private:
  Communicator& data_;
};

bool wanted(const Config& config, const GridShape& shape) {
  return config.precision.types().fp8_gemms() && shape.dp > 1;
}

std::unique_ptr<Strategy> create(const StrategyContext& context) { return std::make_unique<Fp8AmaxAgreement>(context); }

// The floats agreed for one Linear layer's part of a step action, as fp8_linear.cpp's products
// ask for them: tensorwise one per operand whose scale spans rows (the forward's input, the
// input gradient's d pre, the weight gradient's d pre and input), rowwise one per column of the
// weight gradient's two operands.
struct LayerAgreements {
  std::int64_t forward = 0;
  std::int64_t input_gradient = 0;
  std::int64_t weight_gradient = 0;
};
LayerAgreements agreements(Fp8Recipe recipe, const LayerSpec& spec) {
  if (recipe == Fp8Recipe::tensorwise) return {.forward = 1, .input_gradient = 1, .weight_gradient = 2};
  return {.weight_gradient = spec.out_features + spec.in_features};
}

void predict(const RankLayout& layout, Prediction& prediction) {
  const Fp8Recipe recipe = layout.config.precision.fp8;
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
      const LayerSpec& spec = specs[static_cast<std::size_t>(layer - chunk.first)];
      if (spec.moe()) continue;  // an MoE layer's experts compute in the param type
      const LayerAgreements layer_agreements = agreements(recipe, spec);
      std::int64_t floats = 0;
      if (forward) floats += layer_agreements.forward;
      // Backward's B recomputes the forward of a layer whose pre-activation forward dropped.
      const bool recomputed = !recompute.keeps_pre(static_cast<std::size_t>(layer - chunk.first), true);
      if (input_part && recomputed) floats += layer_agreements.forward;
      if (input_part && layer > 0) floats += layer_agreements.input_gradient;
      if (weight_part) floats += layer_agreements.weight_gradient;
      if (floats > 0)
        prediction.add_comm(GroupKind::data, CommOp::all_reduce, floats * static_cast<std::int64_t>(sizeof(float)));
    }
  }
}

std::string describe(const RankLayout& layout) {
  return fmt::format("fp8 scales ({}) agreed over the {} data-parallel ranks", choice_name(layout.config.precision.fp8),
                     layout.shape.dp);
}

constexpr Role roles[] = {Role::agrees_fp8_scales};

}  // namespace

extern const StrategyRegistration fp8_amax_agreement_registration{.name = "fp8_amax_agreement",
                                                                  .roles = roles,
                                                                  .wanted = wanted,
                                                                  .create = create,
                                                                  .predict = predict,
                                                                  .describe = describe};

}  // namespace mlptrain
