// A Linear layer's three products from fp8 operands (--fp8; DESIGN.md §2.7): each operand's
// absolute maximum, agreed with the rest of its population where that lies on other ranks, gives
// its scale (a power of two, core/fp8.hpp); the operand scaled and rounded to its 8-bit format,
// its codes laid out as the backend's GEMM wants them, goes to the backend's fp8 GEMM
// (Kernels::fp8_gemm: fp32 sums, the product unscaled, the bias or the gradient already there
// added in fp32, rounded once). What each product reads and writes is what
// linear_forward_matmul and linear_backward_matmul read and write.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "model/linear.hpp"

namespace mlptrain {

// Which tensor an operand is: the layer's input, its weight, or d loss / d pre.
enum class Fp8Operand { input, weight, output_grad };
// A Linear layer's three products.
enum class LinearProduct { forward, input_gradient, weight_gradient };

// What a product quantizes, in its order: each operand, how it is scaled, its scales (`rows`:
// the rows the layer computes on), and whether the product sums over the operand's rows (rather
// than its columns). The products below and the cost model's count of the agreements both read
// it.
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
// operand before it is scaled; the strategies that split a population agree on it.
using AmaxAgreement = std::function<void(const Fp8OperandScales& scales, float* amax)>;

struct Fp8Products {
  Kernels& kernels;
  Allocator& allocator;
  const AmaxAgreement& agree;
};

// As linear_forward_matmul: pre [rows, out] = input W^T (+ b), from fp8 operands.
void fp8_forward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input, std::int64_t rows,
                        void* pre, BiasPlace bias = BiasPlace::in_product);
// As linear_backward_matmul: grad_input (if not null) and the weight gradient (written or added).
void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input,
                         const void* grad_pre, std::int64_t rows, void* grad_input, bool accumulate,
                         ProductGradients which = ProductGradients::both);

}  // namespace mlptrain
