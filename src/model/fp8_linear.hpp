// A Linear layer's three products from fp8 operands (--fp8; DESIGN.md §2.7): each operand's
// absolute maximum, agreed with the rest of its population where that lies on other ranks, gives
// its scale (a power of two, core/fp8.hpp); the operand scaled and rounded to its 8-bit format is
// multiplied in the backend's GEMM with fp32 accumulation, and the product is unscaled, the bias
// (or the gradient already there) added in fp32 and the result rounded once. What each product
// reads and writes is what linear_forward_matmul and linear_backward_matmul read and write.
#pragma once

#include <cstdint>
#include <functional>

#include "model/linear.hpp"

namespace mlptrain {

// Which tensor an operand is: the layer's input, its weight, or d loss / d pre.
enum class Fp8Operand { input, weight, output_grad };

// Makes an operand's absolute maxima (fp32, `count` of them in the kernels' memory) those of its
// whole population: the operand on every rank that holds a part of it. Called for the input and
// the output gradient wherever one scale spans rows of the micro-batch; a weight is whole where
// it is used.
using AmaxAgreement = std::function<void(Fp8Operand operand, float* amax, std::int64_t count)>;

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
