// fp8 scales agreed over data-parallel replicas (--fp8 with dp > 1; DESIGN.md §2.7). A scale that
// spans rows of a micro-batch (tensorwise: every operand but the weight; rowwise: the weight
// gradient's operands, one per column) is formed from the amax of the whole global micro-batch,
// whose rows the data-parallel ranks split: each rank's amax is maximized over the data-parallel
// group before the operand is scaled. So every data-parallel layout quantizes as one process with
// the same micro-batches does, and the agreement costs an all-reduce of one float (tensorwise) or
// of a layer's widths (rowwise) per operand, beside the GEMM it scales. A weight is whole where it
// is used (replicated, or gathered by ZeRO-3), so its amax is the same on every replica already.
#include <fmt/format.h>

#include "cost/fp8_products.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

// Whether a scale's elements may lie on several data-parallel ranks: any that spans rows of the
// micro-batch (all but one row's own); a weight is whole on every replica.
bool spans_replicas(const Fp8OperandScales& scales) {
  return scales.operand != Fp8Operand::weight && scales.scaling != Fp8Scaling::rows;
}

class Fp8AmaxAgreement final : public Strategy, public LayerHooks, public AgreesFp8Scales {
 public:
  explicit Fp8AmaxAgreement(const StrategyContext& context) : data_(context.groups.group(GroupKind::data)) {}

  void agree_operand_amax(const OperandAmax& event) override {
    if (spans_replicas(event.scales))
      data_.all_reduce(event.amax, static_cast<std::size_t>(event.scales.count), ReduceOp::max);
  }

 private:
  Communicator& data_;
};

bool wanted(const Config& config, const GridShape& shape) {
  return config.precision.types().fp8_gemms() && shape.dp > 1;
}


// An all-reduce of each agreed operand's maxima (fp32) per product run.
void predict(const RankLayout& layout, Prediction& prediction) {
  for_each_fp8_product(layout, [&](const Fp8ProductRun& run) {
    for (const Fp8OperandScales& scales : run.operands_taken(layout.config.precision.fp8, run.input_rows))
      if (spans_replicas(scales))
        prediction.add_comm(GroupKind::data, CommOp::all_reduce,
                            scales.count * static_cast<std::int64_t>(sizeof(float)));
  });
}

std::string describe(const RankLayout& layout) {
  return fmt::format("fp8 scales ({}) agreed over the {} data-parallel ranks", choice_name(layout.config.precision.fp8),
                     layout.shape.dp);
}


}  // namespace

extern const StrategyRegistration fp8_amax_agreement_registration = register_strategy<Fp8AmaxAgreement>({
    .name = "fp8_amax_agreement",
    .wanted = wanted,
    .predict = predict,
    .describe = describe});

}  // namespace mlptrain
