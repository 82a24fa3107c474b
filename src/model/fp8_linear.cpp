// A Linear layer's products from fp8 operands (see fp8_linear.hpp).
#include "model/fp8_linear.hpp"

#include <stdexcept>

namespace mlptrain {

namespace {

// How an operand [rows, cols] is scaled under the recipe, given which of its sides the GEMM sums
// over: tensorwise one scale; rowwise one per line of the side that is not summed over.
Fp8OperandScales operand_scales(Fp8Recipe recipe, Fp8Operand operand, std::int64_t rows, std::int64_t cols,
                                bool sums_over_columns) {
  const Fp8Scaling scaling = recipe == Fp8Recipe::tensorwise ? Fp8Scaling::tensor
                             : sums_over_columns            ? Fp8Scaling::rows
                                                            : Fp8Scaling::columns;
  return {operand, scaling, fp8_scale_count(scaling, rows, cols), !sums_over_columns};
}

Fp8Format format_of(const LinearLayer& layer, Fp8Operand operand) {
  return operand == Fp8Operand::output_grad ? layer.precision.fp8_grad_format : Fp8Format::e4m3;
}

// An operand's amax for `scales`, taken by the kernels' pass into `amax` and agreed.
const float* take_amax(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& scales,
                       const void* data, std::int64_t rows, std::int64_t cols, Buffer& amax) {
  if (amax.empty()) amax = products.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(scales.count));
  products.kernels.absolute_max(data, layer.precision.param, rows, cols, scales.scaling, amax.floats());
  products.agree(scales, amax.floats());
  return amax.floats();
}

// The same where the micro-batch's products share it (a tensorwise scale): read from `shared`
// once agreed, agreed there where its producer took it, else taken there; other scales into `own`.
const float* shared_amax(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& scales,
                         const void* data, std::int64_t rows, std::int64_t cols, SharedAmax& shared, Buffer& own) {
  if (scales.scaling != Fp8Scaling::tensor) return take_amax(products, layer, scales, data, rows, cols, own);
  if (shared.state == AmaxState::local) products.agree(scales, shared.value.floats());
  if (shared.state == AmaxState::absent) take_amax(products, layer, scales, data, rows, cols, shared.value);
  shared.state = AmaxState::agreed;
  return shared.value.floats();
}

// Room for an operand's codes as `scales` says: the GEMM's operand is [lines not summed, summed],
// the operand itself where the product sums over its columns, its transpose where over its
// rows, which the backend codes transposed or leaves for its GEMM to read so.
Fp8Codes code_room(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& scales,
                   std::int64_t rows, std::int64_t cols) {
  Fp8Codes codes{
      .codes = products.allocator.allocate(MemoryState::workspace, static_cast<std::size_t>(rows * cols)),
      .inverse_scales = products.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(scales.count)),
      .format = format_of(layer, scales.operand),
      .scales = scales.scaling == Fp8Scaling::tensor ? Fp8Scaling::tensor : Fp8Scaling::rows,
      .stored = Transpose::no};
  if (scales.sums_over_rows && products.kernels.fp8_summed_rows_layout() == Fp8CodeLayout::as_is)
    codes.stored = Transpose::yes;
  return codes;
}

Fp8CodeLayout layout_for(const Fp8Products& products, const Fp8OperandScales& scales) {
  return scales.sums_over_rows ? products.kernels.fp8_summed_rows_layout() : Fp8CodeLayout::as_is;
}

// `data` [rows, cols] coded for one product.
Fp8Codes code(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& scales,
              const float* amax, const void* data, std::int64_t rows, std::int64_t cols) {
  Fp8Codes codes = code_room(products, layer, scales, rows, cols);
  products.kernels.quantize_fp8(data, layer.precision.param, rows, cols, scales.scaling, amax, codes.format,
                                layout_for(products, scales), codes.codes.as<std::uint8_t>(),
                                codes.inverse_scales.floats());
  return codes;
}

// `data` [rows, cols] coded for a product that sums over its columns and one that sums over its
// rows, in one pass.
struct CodedPair {
  Fp8Codes summed_columns;
  Fp8Codes summed_rows;
};
CodedPair code_pair(const Fp8Products& products, const LinearLayer& layer, const Fp8OperandScales& columns_scales,
                    const float* columns_amax, const Fp8OperandScales& rows_scales, const float* rows_amax,
                    const void* data, std::int64_t rows, std::int64_t cols) {
  CodedPair pair{code_room(products, layer, columns_scales, rows, cols), code_room(products, layer, rows_scales, rows, cols)};
  const auto coding = [](const Fp8OperandScales& scales, const float* amax, Fp8Codes& codes) {
    return Fp8Coding{.scaling = scales.scaling, .amax = amax, .codes = codes.codes.as<std::uint8_t>(),
                     .inverse_scales = codes.inverse_scales.floats()};
  };
  products.kernels.quantize_fp8_pair(data, layer.precision.param, rows, cols, pair.summed_columns.format,
                                     coding(columns_scales, columns_amax, pair.summed_columns),
                                     coding(rows_scales, rows_amax, pair.summed_rows),
                                     products.kernels.fp8_summed_rows_layout());
  return pair;
}

// c [m, n] (of c_type) = the fp8 GEMM of a's codes [m, k] and b's [n, k] (+ bias) (+ c).
struct Fp8Product {
  std::int64_t m, n, k;
  const void* bias;
  void* c;
  DataType c_type;
  bool accumulate;
};
void multiply(const Fp8Products& products, const LinearLayer& layer, const Fp8Product& product, const Fp8Codes& a,
              const Fp8Codes& b) {
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

Fp8WeightScales::Fp8WeightScales(const Fp8Products& products, const LinearLayer& layer) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  take_amax(products, layer, fp8_operands(recipe, LinearProduct::forward, layer.spec, 0)[1], layer.weight, out, in,
            forward_);
  if (recipe != Fp8Recipe::tensorwise)
    take_amax(products, layer, fp8_operands(recipe, LinearProduct::input_gradient, layer.spec, 0)[1], layer.weight,
              out, in, input_gradient_);
}

Fp8WeightCodes::Fp8WeightCodes(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightScales& scales) {
  const Fp8Recipe recipe = layer.precision.fp8;
  CodedPair pair = code_pair(products, layer, fp8_operands(recipe, LinearProduct::forward, layer.spec, 0)[1],
                             scales.forward(), fp8_operands(recipe, LinearProduct::input_gradient, layer.spec, 0)[1],
                             scales.input_gradient(), layer.weight, layer.spec.out_features, layer.spec.in_features);
  forward_ = std::move(pair.summed_columns);
  input_gradient_ = std::move(pair.summed_rows);
}

Fp8WeightCodes::Fp8WeightCodes(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightScales& scales,
                               LinearProduct product) {
  const Fp8OperandScales weight = fp8_operands(layer.precision.fp8, product, layer.spec, 0)[1];
  const bool forward = product == LinearProduct::forward;
  (forward ? forward_ : input_gradient_) =
      code(products, layer, weight, forward ? scales.forward() : scales.input_gradient(), layer.weight,
           layer.spec.out_features, layer.spec.in_features);
}

const Fp8Codes& Fp8WeightCodes::forward() const {
  if (!forward_) throw std::logic_error("fp8: the weight was not coded for the forward");
  return *forward_;
}

const Fp8Codes& Fp8WeightCodes::input_gradient() const {
  if (!input_gradient_) throw std::logic_error("fp8: the weight was not coded for the input gradient");
  return *input_gradient_;
}

void fp8_forward_matmul(const Fp8Products& products, const LinearLayer& layer, const Fp8Codes& weight,
                        const void* input, std::int64_t rows, void* pre, SharedAmax& input_amax, BiasPlace bias) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8OperandScales x_scales = fp8_operands(layer.precision.fp8, LinearProduct::forward, layer.spec, rows)[0];
  Buffer own_amax;
  const float* x_amax = shared_amax(products, layer, x_scales, input, rows, in, input_amax, own_amax);
  const Fp8Codes x = code(products, layer, x_scales, x_amax, input, rows, in);
  multiply(products, layer,
           {.m = rows, .n = out, .k = in, .bias = bias == BiasPlace::in_product ? layer.bias : nullptr, .c = pre,
            .c_type = layer.precision.param, .accumulate = false},
           x, weight);
}

void fp8_backward_matmul(const Fp8Products& products, const LinearLayer& layer, const Fp8WeightForInput& weight,
                         const void* input, const void* grad_pre, std::int64_t rows, void* grad_input,
                         bool accumulate, Fp8LayerAmax& amax, ProductGradients which) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const Fp8Recipe recipe = layer.precision.fp8;
  const bool input_gradient = grad_input != nullptr && which != ProductGradients::weight;
  const bool weight_gradient = which != ProductGradients::input;
  const Fp8OperandScales g_for_input = fp8_operands(recipe, LinearProduct::input_gradient, layer.spec, rows)[0];
  const auto [g_for_weight, x_for_weight] = fp8_operands(recipe, LinearProduct::weight_gradient, layer.spec, rows);
  // d(pre)'s amax: shared by both products (tensorwise), each product's own (rowwise).
  Buffer g_input_amax, g_weight_amax, x_weight_amax;
  const float* g_input_max =
      input_gradient ? shared_amax(products, layer, g_for_input, grad_pre, rows, out, amax.output_grad, g_input_amax)
                     : nullptr;
  const float* g_weight_max =
      weight_gradient ? shared_amax(products, layer, g_for_weight, grad_pre, rows, out, amax.output_grad, g_weight_amax)
                      : nullptr;
  // d(pre) coded for both products in one pass where both run, else for the one.
  Fp8Codes g_input, g_weight;
  if (input_gradient && weight_gradient) {
    CodedPair pair = code_pair(products, layer, g_for_input, g_input_max, g_for_weight, g_weight_max, grad_pre, rows, out);
    g_input = std::move(pair.summed_columns);
    g_weight = std::move(pair.summed_rows);
  } else if (input_gradient) {
    g_input = code(products, layer, g_for_input, g_input_max, grad_pre, rows, out);
  } else if (weight_gradient) {
    g_weight = code(products, layer, g_for_weight, g_weight_max, grad_pre, rows, out);
  }
  // dX before dW, as linear_backward_matmul.
  if (input_gradient)  // dX [rows, in] = g [rows, out] W [out, in]: W^T [in, out] summed over out
    multiply(products, layer,
             {.m = rows, .n = in, .k = out, .bias = nullptr, .c = grad_input, .c_type = layer.precision.param,
              .accumulate = false},
             g_input, weight());
  if (!weight_gradient) return;
  // dW [out, in] (+)= g^T [out, rows] x [rows, in]: x^T [in, rows] summed over rows.
  const float* x_max = shared_amax(products, layer, x_for_weight, input, rows, in, amax.input, x_weight_amax);
  const Fp8Codes x = code(products, layer, x_for_weight, x_max, input, rows, in);
  multiply(products, layer,
           {.m = out, .n = in, .k = rows, .bias = nullptr, .c = layer.weight_grad, .c_type = layer.precision.reduce,
            .accumulate = accumulate},
           g_weight, x);
}

std::vector<Fp8OperandScales> fp8_operands_taken(Fp8Recipe recipe, LinearProduct product, const LayerSpec& spec,
                                                 std::int64_t rows, bool codes_weight, bool computes_input_gradient) {
  const std::array<Fp8OperandScales, 2> operands = fp8_operands(recipe, product, spec, rows);
  const bool tensorwise = recipe == Fp8Recipe::tensorwise;
  std::vector<Fp8OperandScales> taken;
  switch (product) {
    case LinearProduct::forward:
      taken.push_back(operands[0]);
      if (codes_weight) {
        taken.push_back(operands[1]);
        if (!tensorwise) taken.push_back(fp8_operands(recipe, LinearProduct::input_gradient, spec, rows)[1]);
      }
      break;
    case LinearProduct::input_gradient:
      taken.push_back(operands[0]);
      break;
    case LinearProduct::weight_gradient:
      if (!tensorwise || !computes_input_gradient) taken.push_back(operands[0]);
      if (!tensorwise) taken.push_back(operands[1]);
      break;
  }
  return taken;
}

}  // namespace mlptrain
