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

Fp8OperandScales operand_scales(Fp8Recipe recipe, Fp8Operand operand, std::int64_t rows, std::int64_t cols,
                                bool sums_over_columns) {
  const Fp8Scaling scaling = scaling_for(recipe, sums_over_columns);
  return {operand, scaling, fp8_scale_count(scaling, rows, cols)};
}

// `data` [rows, cols] of the layer's operand `scales` says, quantized.
Quantized quantize(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& scales,
                   const void* data, std::int64_t rows, std::int64_t cols) {
  const Precision& precision = layer.precision;
  const Fp8Format format = scales.operand == Fp8Operand::output_grad ? precision.fp8_grad_format : Fp8Format::e4m3;
  const auto count = static_cast<std::size_t>(scales.count);
  Buffer amax = products.allocator.allocate_floats(MemoryState::workspace, count);
  products.kernels.absolute_max(data, precision.param, rows, cols, scales.scaling, amax.floats());
  products.agree(scales, amax.floats());
  Quantized quantized{
      .values = products.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(rows * cols),
                                                     precision.param),
      .inverse_scales = products.allocator.allocate_floats(MemoryState::workspace, count)};
  products.kernels.quantize_fp8(data, precision.param, rows, cols, scales.scaling, amax.floats(), format,
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

std::array<Fp8OperandScales, 2> fp8_operands(Fp8Recipe recipe, LinearProduct product, const LayerSpec& spec,
                                             std::int64_t rows) {
  const std::int64_t in = spec.in_features, out = spec.out_features;
  switch (product) {
    case LinearProduct::forward:  // pre [rows, out] = x [rows, in] W^T: both sum over their columns (in)
      return {operand_scales(recipe, Fp8Operand::input, rows, in, true),
              operand_scales(recipe, Fp8Operand::weight, out, in, true)};
    case LinearProduct::input_gradient:  // dX [rows, in] = g [rows, out] W [out, in]: g over its columns, W its rows
      return {operand_scales(recipe, Fp8Operand::output_grad, rows, out, true),
              operand_scales(recipe, Fp8Operand::weight, out, in, false)};
    case LinearProduct::weight_gradient:  // dW [out, in] = g^T [out, rows] x [rows, in]: both over their rows
      return {operand_scales(recipe, Fp8Operand::output_grad, rows, out, false),
              operand_scales(recipe, Fp8Operand::input, rows, in, false)};
  }
  return {};
}

void fp8_forward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input, std::int64_t rows,
                        void* pre, BiasPlace bias) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const auto [x_scales, w_scales] = fp8_operands(layer.precision.fp8, LinearProduct::forward, layer.spec, rows);
  const Quantized x = quantize(products, layer, x_scales, input, rows, in);
  const Quantized w = quantize(products, layer, w_scales, layer.weight, out, in);
  unscaled_product(products,
                   {.transpose_b = Transpose::yes, .m = rows, .n = out, .k = in, .lda = in, .ldb = in, .c = pre,
                    .input = layer.precision.param},
                   {x, x_scales.scaling}, {w, w_scales.scaling}, bias == BiasPlace::in_product ? layer.bias : nullptr,
                   layer.precision.param, false);
}

void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input,
                         const void* grad_pre, std::int64_t rows, void* grad_input, bool accumulate,
                         ProductGradients which) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  const DataType type = layer.precision.param;
  // dX before dW, as linear_backward_matmul: a caller may let dW overwrite W.
  if (grad_input != nullptr && which != ProductGradients::weight) {
    const auto [g_scales, w_scales] = fp8_operands(recipe, LinearProduct::input_gradient, layer.spec, rows);
    const Quantized g = quantize(products, layer, g_scales, grad_pre, rows, out);
    const Quantized w = quantize(products, layer, w_scales, layer.weight, out, in);
    unscaled_product(products, {.m = rows, .n = in, .k = out, .lda = out, .ldb = in, .c = grad_input, .input = type},
                     {g, g_scales.scaling}, {w, w_scales.scaling}, nullptr, type, false);
  }
  if (which == ProductGradients::input) return;
  const auto [g_scales, x_scales] = fp8_operands(recipe, LinearProduct::weight_gradient, layer.spec, rows);
  const Quantized g = quantize(products, layer, g_scales, grad_pre, rows, out);
  const Quantized x = quantize(products, layer, x_scales, input, rows, in);
  unscaled_product(products,
                   {.transpose_a = Transpose::yes, .m = out, .n = in, .k = rows, .lda = out, .ldb = in,
                    .c = layer.weight_grad, .input = type},
                   {g, g_scales.scaling}, {x, x_scales.scaling}, nullptr, layer.precision.reduce, accumulate);
}

}  // namespace mlptrain
