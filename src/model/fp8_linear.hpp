// A Linear layer's three products from fp8 operands (--fp8; DESIGN.md §2.7): each operand's
// absolute maximum, agreed with the rest of its population where that lies on other ranks, gives
// its scale (a power of two, core/fp8.hpp); the operand scaled and rounded to its 8-bit format,
// its codes laid out as the backend's GEMM wants them, goes to the backend's fp8 GEMM
// (Kernels::fp8_gemm: fp32 sums, the product unscaled, the bias or the gradient already there
// added in fp32, rounded once). What each product reads and writes is what
// linear_forward_matmul and linear_backward_matmul read and write.
//
// Each operand's amax is taken once and its codes made once for every product that reads them:
// the weight's once a step (Fp8WeightScales), its codes for both products made once a step where
// it stays in place (Fp8WeightCodes); under tensorwise scaling x's
// by the forward (or by the GELU that made it) for the weight gradient too, and d(pre)'s by its
// first product (or by the GELU's backward) for the other (Fp8LayerAmax); an operand two
// products read in one micro-batch is coded for both in one pass (Kernels::quantize_fp8_pair).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/linear.hpp"

namespace mlptrain {

// Which tensor an operand is: the layer's input, its weight, or d loss / d pre.
enum class Fp8Operand { input, weight, output_grad };
// A Linear layer's three products.
enum class LinearProduct { forward, input_gradient, weight_gradient };

// What a product quantizes, in its order: each operand, how it is scaled, its scales (`rows`:
// the rows the layer computes on), and whether the product sums over the operand's rows (rather
// than its columns).
struct Fp8OperandScales {
  Fp8Operand operand;
  Fp8Scaling scaling;
  std::int64_t count;
  bool sums_over_rows;
};
std::array<Fp8OperandScales, 2> fp8_operands(Fp8Recipe recipe, LinearProduct product, const LayerSpec& spec,
                                             std::int64_t rows);

// Makes an operand's absolute maxima (fp32, `scales.count` of them in the kernels' memory) those
// of its whole population: the operand on every rank that holds a part of it. Called for every
// amax a product takes (fp8_operands_taken); the strategies that split a population agree on it.
using AmaxAgreement = std::function<void(const Fp8OperandScales& scales, float* amax)>;

struct Fp8Products {
  Kernels& kernels;
  Allocator& allocator;
  const AmaxAgreement& agree;
};

// An operand's codes as a product reads them: the codes (a byte an element), the inverses of its
// scales, its format, how its scales run along the GEMM's operand (one for all, or one a row of
// it), and whether the codes lie transposed to it.
struct Fp8Codes {
  Buffer codes;
  Buffer inverse_scales;
  Fp8Format format = Fp8Format::e4m3;
  Fp8Scaling scales = Fp8Scaling::tensor;
  Transpose stored = Transpose::no;
};

// A tensorwise amax the products of one micro-batch share (one float, the kernels' memory):
// absent; `local`, taken over this rank's part by the kernel that made the operand and still to
// be agreed; or agreed, its population's.
enum class AmaxState { absent, local, agreed };
struct SharedAmax {
  Buffer value;
  AmaxState state = AmaxState::absent;
};
// A layer's, for one micro-batch: x's (the forward agrees it, the weight gradient reads it) and
// d(pre)'s (its first product agrees it, the other reads it; B's is W's). Rowwise scales these
// operands differently in each product and shares neither.
struct Fp8LayerAmax {
  SharedAmax input;
  SharedAmax output_grad;
};

// A layer's weight's amax for a step's products, taken and agreed once, at the step's first
// forward of the layer (tensorwise one; rowwise by rows for the forward and by columns for the
// input gradient): the weight does not change within a step.
class Fp8WeightScales {
 public:
  Fp8WeightScales(const Fp8Products& products, const LinearLayer& layer);
  const float* forward() const { return forward_.floats(); }
  const float* input_gradient() const { return (input_gradient_.empty() ? forward_ : input_gradient_).floats(); }

 private:
  Buffer forward_;
  Buffer input_gradient_;  // tensorwise: none, the forward's one scale
};

// The weight coded with the step's scales: for both its products in one pass (a weight that
// stays where it is through the step, coded once and read by every micro-batch), or for one
// product (a weight a strategy gathers for each use, as ZeRO-3 does: its codes go with it).
class Fp8WeightCodes {
 public:
  Fp8WeightCodes(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightScales& scales);
  Fp8WeightCodes(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightScales& scales,
                 LinearProduct product);
  const Fp8Codes& forward() const;
  const Fp8Codes& input_gradient() const;

 private:
  std::optional<Fp8Codes> forward_;
  std::optional<Fp8Codes> input_gradient_;
};

// As linear_forward_matmul: pre [rows, out] = input W^T (+ b), from fp8 operands, the weight's
// codes given; x's amax into (or, where its producer took it, from) `input_amax`.
void fp8_forward_matmul(const Fp8Products& products, const LinearLayer& layer, const Fp8Codes& weight,
                        const void* input, std::int64_t rows, void* pre, SharedAmax& input_amax,
                        BiasPlace bias = BiasPlace::in_product);
// As linear_backward_matmul: grad_input (if not null) and the weight gradient (written or added),
// sharing the micro-batch's amax of x and d(pre) in `amax`; `weight` gives the weight's codes for
// the input gradient, asked where that is computed.
using Fp8WeightForInput = std::function<const Fp8Codes&()>;
void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightForInput& weight,
                         const void* input, const void* grad_pre, std::int64_t rows, void* grad_input,
                         bool accumulate, Fp8LayerAmax& amax, ProductGradients which = ProductGradients::both);

// The operands whose amax each product takes and agrees on itself (the cost model counts the
// agreements from it): the weight's scales once a step (`codes_weight`, a step's first forward
// of the layer), x in the forward, d(pre) in its first product (the input gradient, or
// the weight gradient where the layer computes no input gradient); rowwise, the weight
// gradient's d(pre) and x as well.
std::vector<Fp8OperandScales> fp8_operands_taken(Fp8Recipe recipe, LinearProduct product, const LayerSpec& spec,
                                                 std::int64_t rows, bool codes_weight, bool computes_input_gradient);

}  // namespace mlptrain
