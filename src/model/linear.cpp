// Linear layer forward and backward (see linear.hpp).
#include "model/linear.hpp"

namespace mlptrain {

LinearLayer linear_layer_view(const ParameterStore& store, const LayerSpec& spec,
                              const std::string& base_path) {
  const ParameterTensor& weight = store.tensor(base_path + "/weight");
  const ParameterTensor& bias = store.tensor(base_path + "/bias");
  LinearLayer layer{.spec = spec};
  layer.spec.out_features = weight.local_shape[0];
  layer.spec.in_features = weight.local_shape[1];
  // Null where the store does not hold the memory: a strategy points the view at its own.
  if (store.values() != nullptr) {
    layer.weight = store.values() + weight.offset;
    layer.bias = store.values() + bias.offset;
  }
  if (store.grads() != nullptr) {
    layer.weight_grad = store.grads() + weight.offset;
    layer.bias_grad = store.grads() + bias.offset;
  }
  return layer;
}

void linear_forward_matmul(Kernels& kernels, const LinearLayer& layer, const float* input,
                           std::int64_t rows, float* pre) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  kernels.gemm(Transpose::no, Transpose::yes, rows, out, in, 1.0f, input, in, layer.weight, in,
               0.0f, pre, out);
}

void linear_forward_finish(Kernels& kernels, const LinearLayer& layer, std::int64_t rows,
                           float* pre, float* activated) {
  const std::int64_t out = layer.spec.out_features;
  if (layer.spec.gelu) {
    kernels.bias_gelu_forward(pre, layer.bias, activated, rows, out);
  } else {
    kernels.bias_add(pre, layer.bias, rows, out);
  }
}

void linear_backward(Kernels& kernels, const LinearLayer& layer, const float* input,
                     const float* pre, const float* grad_output, std::int64_t rows,
                     float* grad_pre, float* grad_input, bool accumulate) {
  const std::int64_t in = layer.spec.in_features, out = layer.spec.out_features;
  const float* grad_linear = grad_output;
  if (layer.spec.gelu) {
    kernels.gelu_backward(grad_output, pre, grad_pre, layer.bias_grad, accumulate, rows, out);
    grad_linear = grad_pre;
  } else {
    kernels.column_sums(grad_output, layer.bias_grad, accumulate, rows, out);
  }
  // dX before dW: the last use of W comes first, so a caller may let dW overwrite W.
  if (grad_input != nullptr) {
    // dX [rows, in] = grad_linear [rows, out] x W [out, in]
    kernels.gemm(Transpose::no, Transpose::no, rows, in, out, 1.0f, grad_linear, out, layer.weight,
                 in, 0.0f, grad_input, in);
  }
  // dW [out, in] (+)= grad_linear^T [out, rows] x input [rows, in]
  kernels.gemm(Transpose::yes, Transpose::no, out, in, rows, 1.0f, grad_linear, out, input, in,
               accumulate ? 1.0f : 0.0f, layer.weight_grad, in);
}

}  // namespace mlptrain
