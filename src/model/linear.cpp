// Linear layer forward and backward (see linear.hpp).
#include "model/linear.hpp"

namespace mlptrain {

LinearLayer linear_layer_view(const ParameterStore& store, const LayerSpec& spec,
                              const std::string& base_path) {
  const ParameterTensor& weight = store.tensor(base_path + "/weight");
  const ParameterTensor& bias = store.tensor(base_path + "/bias");
  LinearLayer layer{.spec = spec, .precision = store.precision()};
  layer.spec.out_features = weight.local_shape[0];
  layer.spec.in_features = weight.local_shape[1];
  // Null where the store does not hold the memory: a strategy points the view at its own.
  layer.weight = store.value_at(weight.offset);
  layer.bias = store.value_at(bias.offset);
  layer.weight_grad = store.grad_at(weight.offset);
  layer.bias_grad = store.grad_at(bias.offset);
  return layer;
}

void linear_forward_matmul(Kernels& kernels, const LinearLayer& layer, const void* input,
                           std::int64_t rows, void* pre, BiasPlace bias) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const DataType type = layer.precision.param;
  kernels.gemm({.transpose_b = Transpose::yes, .m = rows, .n = out, .k = in, .a = input, .lda = in,
                .b = layer.weight, .ldb = in, .c = pre, .ldc = out, .input = type, .output = type,
                .bias = bias == BiasPlace::in_product ? layer.bias : nullptr});
}

void linear_forward_finish(Kernels& kernels, const LinearLayer& layer, std::int64_t rows,
                           const void* pre, void* activated, std::optional<float*> amax) {
  if (!layer.spec.gelu) return;
  if (amax)
    kernels.gelu_forward_amax(pre, activated, rows, layer.spec.out_features, layer.precision.param, *amax);
  else
    kernels.gelu_forward(pre, activated, rows, layer.spec.out_features, layer.precision.param);
}

void linear_backward(Kernels& kernels, const LinearLayer& layer, const void* input,
                     const void* pre, const void* grad_output, std::int64_t rows,
                     void* grad_pre, void* grad_input, bool accumulate) {
  const void* grad_linear =
      linear_backward_activation(kernels, layer, pre, grad_output, rows, grad_pre, layer.bias_grad, accumulate);
  linear_backward_matmul(kernels, layer, input, grad_linear, rows, grad_input, accumulate);
}

const void* linear_backward_activation(Kernels& kernels, const LinearLayer& layer, const void* pre,
                                       const void* grad_output, std::int64_t rows, void* grad_pre,
                                       void* bias_grad, bool accumulate, std::optional<float*> amax) {
  const std::int64_t out = layer.spec.out_features;
  const DataType type = layer.precision.param, grad_type = layer.precision.reduce;
  if (!layer.spec.gelu) {
    kernels.column_sums(grad_output, type, bias_grad, grad_type, accumulate, rows, out);
    return grad_output;
  }
  if (amax)
    kernels.gelu_backward_amax(grad_output, pre, grad_pre, type, bias_grad, grad_type, accumulate, rows, out, *amax);
  else
    kernels.gelu_backward(grad_output, pre, grad_pre, type, bias_grad, grad_type, accumulate, rows, out);
  return grad_pre;
}

void linear_backward_matmul(Kernels& kernels, const LinearLayer& layer, const void* input, const void* grad_pre,
                            std::int64_t rows, void* grad_input, bool accumulate, ProductGradients which) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const DataType type = layer.precision.param, grad_type = layer.precision.reduce;
  // dX before dW: the last use of W comes first, so a caller may let dW overwrite W.
  if (grad_input != nullptr && which != ProductGradients::weight) {
    // dX [rows, in] = grad_pre [rows, out] x W [out, in]
    kernels.gemm({.m = rows, .n = in, .k = out, .a = grad_pre, .lda = out, .b = layer.weight, .ldb = in,
                  .c = grad_input, .ldc = in, .input = type, .output = type});
  }
  if (which == ProductGradients::input) return;
  // dW [out, in] (+)= grad_pre^T [out, rows] x input [rows, in], into the gradients' type.
  kernels.gemm({.transpose_a = Transpose::yes, .m = out, .n = in, .k = rows, .a = grad_pre, .lda = out,
                .b = input, .ldb = in, .beta = accumulate ? 1.0f : 0.0f, .c = layer.weight_grad, .ldc = in,
                .input = type, .output = grad_type});
}

}  // namespace mlptrain
