// The fp8 products a rank runs in one training step (--fp8; DESIGN.md §2.7), for the strategies
// whose agreement on the operands' amax costs an all-reduce per operand: each forward (and each
// recomputed forward), input gradient and weight gradient of a dense Linear layer, as the
// schedule's actions run them. model/fp8_linear.hpp's fp8_operands says what each quantizes.
#pragma once

#include <cstdint>
#include <functional>

#include "cost/rank_layout.hpp"
#include "model/fp8_linear.hpp"

namespace mlptrain {

struct Fp8ProductRun {
  int layer;
  const LayerSpec& spec;    // this rank's local shape
  LinearProduct product;
  std::int64_t input_rows;  // the rows the layer receives (a strategy may compute on others)
};

void for_each_fp8_product(const RankLayout& layout, const std::function<void(const Fp8ProductRun&)>& visit);

}  // namespace mlptrain
