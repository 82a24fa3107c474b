// A Linear layer's products from fp8 operands (see fp8_linear.hpp).
#include "model/fp8_linear.hpp"

namespace mlptrain {

namespace {

// An operand's codes, the inverses of its scales, its format, how its scales run along the
// GEMM's operand (one for all, or one a row of it), and whether the codes lie transposed to it.
struct Quantized {
  Buffer codes;
  Buffer inverse_scales;
  Fp8Format format;
  Fp8Scaling scales;
  Transpose stored;
};

// How an operand [rows, cols] is scaled under the recipe, given which of its sides the GEMM sums
// over: tensorwise one scale; rowwise one per line of the side that is not summed over.
Fp8OperandScales operand_scales(Fp8Recipe recipe, Fp8Operand operand, std::int64_t rows, std::int64_t cols,
                                bool sums_over_columns) {
  const Fp8Scaling scaling = recipe == Fp8Recipe::tensorwise ? Fp8Scaling::tensor
                             : sums_over_columns            ? Fp8Scaling::rows
                                                            : Fp8Scaling::columns;
  return {operand, scaling, fp8_scale_count(scaling, rows, cols), !sums_over_columns};
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
      .codes = products.allocator.allocate(MemoryState::workspace, static_cast<std::size_t>(rows * cols)),
      .inverse_scales = products.allocator.allocate_floats(MemoryState::workspace, count),
      .format = format,
      .scales = scales.scaling == Fp8Scaling::tensor ? Fp8Scaling::tensor : Fp8Scaling::rows,
      .stored = Transpose::no};
  // The GEMM's operand is [lines not summed, summed]: the operand itself where the product sums
  // over its columns, its transpose where over its rows, which the backend codes transposed or
  // leaves for its GEMM to read so.
  Fp8CodeLayout layout = Fp8CodeLayout::as_is;
  if (scales.sums_over_rows) {
    layout = products.kernels.fp8_summed_rows_layout();
    quantized.stored = layout == Fp8CodeLayout::as_is ? Transpose::yes : Transpose::no;
  }
  products.kernels.quantize_fp8(data, precision.param, rows, cols, scales.scaling, amax.floats(), format, layout,
                                quantized.codes.as<std::uint8_t>(), quantized.inverse_scales.floats());
  return quantized;
}

// c [m, n] (of c_type) = the fp8 GEMM of a's codes [m, k] and b's [n, k] (+ bias) (+ c).
struct Fp8Product {
  std::int64_t m, n, k;
  const void* bias;
  void* c;
  DataType c_type;
  bool accumulate;
};
void multiply(const Fp8Products& products, const LinearLayer& layer, const Fp8Product& product, const Quantized& a,
              const Quantized& b) {
  const std::size_t workspace_bytes = products.kernels.fp8_gemm_workspace_bytes(product.m, product.n, product.k);
  Buffer workspace =
      workspace_bytes > 0 ? products.allocator.allocate(MemoryState::workspace, workspace_bytes) : Buffer{};
  products.kernels.fp8_gemm({.m = product.m, .n = product.n, .k = product.k, .transpose_a = a.stored,
                             .transpose_b = b.stored, .a = a.codes.as<std::uint8_t>(), .a_format = a.format,
                             .a_inverse = a.inverse_scales.floats(), .a_scales = a.scales,
                             .b = b.codes.as<std::uint8_t>(), .b_format = b.format,
                             .b_inverse = b.inverse_scales.floats(), .b_scales = b.scales,
                             .bias = product.bias, .c = product.c, .c_type = product.c_type,
                             .accumulate = product.accumulate,
                             .fast_accumulation = layer.precision.fp8_fast_accumulation,
                             .workspace = workspace_bytes > 0 ? workspace.as<void>() : nullptr});
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
  multiply(products, layer,
           {.m = rows, .n = out, .k = in, .bias = bias == BiasPlace::in_product ? layer.bias : nullptr, .c = pre,
            .c_type = layer.precision.param, .accumulate = false},
           x, w);
}

void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const void* input,
                         const void* grad_pre, std::int64_t rows, void* grad_input, bool accumulate,
                         ProductGradients which) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  // dX before dW, as linear_backward_matmul: a caller may let dW overwrite W.
  if (grad_input != nullptr && which != ProductGradients::weight) {
    const auto [g_scales, w_scales] = fp8_operands(recipe, LinearProduct::input_gradient, layer.spec, rows);
    const Quantized g = quantize(products, layer, g_scales, grad_pre, rows, out);
    const Quantized w = quantize(products, layer, w_scales, layer.weight, out, in);  // W^T [in, out] summed over out
    multiply(products, layer,
             {.m = rows, .n = in, .k = out, .bias = nullptr, .c = grad_input, .c_type = layer.precision.param,
              .accumulate = false},
             g, w);
  }
  if (which == ProductGradients::input) return;
  const auto [g_scales, x_scales] = fp8_operands(recipe, LinearProduct::weight_gradient, layer.spec, rows);
  const Quantized g = quantize(products, layer, g_scales, grad_pre, rows, out);  // g^T [out, rows]
  const Quantized x = quantize(products, layer, x_scales, input, rows, in);      // x^T [in, rows]
  multiply(products, layer,
           {.m = out, .n = in, .k = rows, .bias = nullptr, .c = layer.weight_grad, .c_type = layer.precision.reduce,
            .accumulate = accumulate},
           g, x);
}

}  // namespace mlptrain
