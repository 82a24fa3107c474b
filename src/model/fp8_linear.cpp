// A Linear layer's products from fp8 operands (see fp8_linear.hpp).
#include "model/fp8_linear.hpp"

namespace mlptrain {

namespace {

// An operand rounded to its format (held in the param type, whose values the format's are) and
// the inverses of its scales.
struct Quantized {
  Buffer values;
  Buffer inverse_scales;
};

// How an operand [rows, cols] is scaled under the recipe, given which of its sides the GEMM sums
// over: tensorwise one scale; rowwise one per line of the side that is not summed over.
Fp8Scaling scaling_for(Fp8Recipe recipe, bool sums_over_columns) {
  if (recipe == Fp8Recipe::tensorwise) return Fp8Scaling::tensor;
  return sums_over_columns ? Fp8Scaling::rows : Fp8Scaling::columns;
}

Quantized quantize(const Fp8Products& products, const LinearLayer& layer, Fp8Operand operand, const void* data,
                   std::int64_t rows, std::int64_t cols, bool sums_over_columns) {
  const Precision& precision = layer.precision;
  const Fp8Scaling scaling = scaling_for(precision.fp8, sums_over_columns);
  const Fp8Format format = operand == Fp8Operand::output_grad ? precision.fp8_grad_format : Fp8Format::e4m3;
  const std::int64_t count = fp8_scale_count(scaling, rows, cols);
  Buffer amax = products.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(count));
  products.kernels.absolute_max(data, precision.param, rows, cols, scaling, amax.floats());
  // A scale per row is the row's own; any other spans rows some other rank may hold too.
  if (operand != Fp8Operand::weight && scaling != Fp8Scaling::rows) products.agree(operand, amax.floats(), count);
  Quantized quantized{
      .values = products.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(rows * cols),
                                                     precision.param),
      .inverse_scales = products.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(count))};
  products.kernels.quantize_fp8(data, precision.param, rows, cols, scaling, amax.floats(), format,
                                quantized.values.as<void>(), quantized.inverse_scales.floats());
  return quantized;
}

// c [m, n] (of c_type) = unscaled (a_q op b_q) (+ bias) (+ c), the GEMM's operands quantized;
// a's scales are the product's rows', b's its columns'.
struct ScaledOperand {
  const Quantized& quantized;
  Fp8Scaling scaling;
};
void unscaled_product(const Fp8Products& products, Gemm gemm, const ScaledOperand& a, const ScaledOperand& b,
                      const void* bias, DataType c_type, bool accumulate) {
  void* const c = gemm.c;
  Buffer accumulator =
      products.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(gemm.m * gemm.n));
  gemm.a = a.quantized.values.as<void>();
  gemm.b = b.quantized.values.as<void>();
  gemm.c = accumulator.floats();
  gemm.ldc = gemm.n;
  gemm.output = DataType::float32;
  products.kernels.gemm(gemm);
  products.kernels.unscale_fp8_product(accumulator.floats(), gemm.m, gemm.n, a.quantized.inverse_scales.floats(),
                                       a.scaling, b.quantized.inverse_scales.floats(), b.scaling, bias, c, c_type,
                                       accumulate);
}

}  // namespace

void fp8_forward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input, std::int64_t rows,
                        void* pre, BiasPlace bias) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  // pre [rows, out] = x [rows, in] W^T: both sum over their columns (in).
  const Quantized x = quantize(products, layer, Fp8Operand::input, input, rows, in, true);
  const Quantized w = quantize(products, layer, Fp8Operand::weight, layer.weight, out, in, true);
  unscaled_product(products,
                   {.transpose_b = Transpose::yes, .m = rows, .n = out, .k = in, .lda = in, .ldb = in, .c = pre,
                    .input = layer.precision.param},
                   {x, scaling_for(recipe, true)}, {w, scaling_for(recipe, true)},
                   bias == BiasPlace::in_product ? layer.bias : nullptr, layer.precision.param, false);
}

void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input,
                         const void* grad_pre, std::int64_t rows, void* grad_input, bool accumulate,
                         ProductGradients which) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  const DataType type = layer.precision.param;
  // dX before dW, as linear_backward_matmul: a caller may let dW overwrite W.
  if (grad_input != nullptr && which != ProductGradients::weight) {
    // dX [rows, in] = g [rows, out] W [out, in]: g sums over its columns, W over its rows.
    const Quantized g = quantize(products, layer, Fp8Operand::output_grad, grad_pre, rows, out, true);
    const Quantized w = quantize(products, layer, Fp8Operand::weight, layer.weight, out, in, false);
    unscaled_product(products, {.m = rows, .n = in, .k = out, .lda = out, .ldb = in, .c = grad_input, .input = type},
                     {g, scaling_for(recipe, true)}, {w, scaling_for(recipe, false)}, nullptr, type, false);
  }
  if (which == ProductGradients::input) return;
  // dW [out, in] (+)= g^T [out, rows] x [rows, in]: both sum over their rows.
  const Quantized g = quantize(products, layer, Fp8Operand::output_grad, grad_pre, rows, out, false);
  const Quantized x = quantize(products, layer, Fp8Operand::input, input, rows, in, false);
  unscaled_product(products,
                   {.transpose_a = Transpose::yes, .m = out, .n = in, .k = rows, .lda = out, .ldb = in,
                    .c = layer.weight_grad, .input = type},
                   {g, scaling_for(recipe, false)}, {x, scaling_for(recipe, false)}, nullptr, layer.precision.reduce,
                   accumulate);
}

}  // namespace mlptrain
