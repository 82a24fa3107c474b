// The fp8 products a rank runs in one training step (--fp8; DESIGN.md §2.7), for the strategies
// whose agreement on the operands' amax costs an all-reduce per operand: each forward (and each
// recomputed forward), input gradient and weight gradient of a dense Linear layer, as the
// schedule's actions run them. model/fp8_linear.hpp's fp8_operands_taken says whose amax each
// takes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cost/rank_layout.hpp"
#include "model/fp8_linear.hpp"

namespace mlptrain {

struct Fp8ProductRun {
  int layer;
  const LayerSpec& spec;    // this rank's local shape
  LinearProduct product;
  std::int64_t input_rows;  // the rows the layer receives (a strategy may compute on others)
  bool codes_weight;        // the step's first forward of the layer, which codes its weight
  bool computes_input_gradient;

  // The operands whose amax this product takes and agrees on (fp8_operands_taken), for the
  // layer computing on `rows` rows.
  std::vector<Fp8OperandScales> operands_taken(Fp8Recipe recipe, std::int64_t rows) const {
    return fp8_operands_taken(recipe, product, spec, rows, codes_weight, computes_input_gradient);
  }
};

void for_each_fp8_product(const RankLayout& layout, const std::function<void(const Fp8ProductRun&)>& visit);

}  // namespace mlptrain
