// A Linear layer y = x W^T + b (W [out, in], PyTorch's convention) with an optional exact GELU,
// as explicit forward and backward pieces. The pieces are separate so that the training loop can
// run strategy hooks between the matrix product and the activation (where tensor parallelism
// reduces partial sums, and adds the bias to their sum) without the layer knowing about any
// strategy.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/kernels.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"

namespace mlptrain {

// Views into the flat buffers; in/out are this rank's local sizes. The weights, the bias and the
// activations the layer reads and writes are of the precision's param type, the gradients of its
// reduce type: GEMMs accumulate in fp32 and round each result once.
struct LinearLayer {
  LayerSpec spec;
  void* weight = nullptr;
  void* bias = nullptr;
  void* weight_grad = nullptr;
  void* bias_grad = nullptr;
  Precision precision;
};

LinearLayer linear_layer_view(const ParameterStore& store, const LayerSpec& spec,
                              const std::string& base_path);

// Whether the forward GEMM adds the bias: yes, unless the product is a partial sum whose
// summing adds it (the bias joins a sum before that sum is rounded, DESIGN.md §2.7).
enum class BiasPlace { in_product, after_sum };
// pre [rows, out] = input [rows, in] W^T (+ b, in the fp32 accumulator), rounded once.
void linear_forward_matmul(Kernels& kernels, const LinearLayer& layer, const void* input,
                           std::int64_t rows, void* pre, BiasPlace bias = BiasPlace::in_product);
// activated = GELU(pre) when the layer has one (nothing to do otherwise); with `amax`, the largest
// |activated| too (Kernels::gelu_forward_amax: the next layer's fp8 input's, taken where it is made).
void linear_forward_finish(Kernels& kernels, const LinearLayer& layer, std::int64_t rows, const void* pre,
                           void* activated, std::optional<float*> amax = std::nullopt);

// From grad_output (d loss / d output of the layer: of the GELU if it has one, else of pre):
// grad_pre (workspace [rows, out]) = d loss / d pre, bias and weight gradients written
// (accumulate = false) or added (accumulate = true), and grad_input [rows, in] if not null. The
// bias and the weight are read before their gradients are written, so the gradients may share
// their memory (sharded parameters gathered only for this layer's use do).
void linear_backward(Kernels& kernels, const LinearLayer& layer, const void* input, const void* pre,
                     const void* grad_output, std::int64_t rows, void* grad_pre, void* grad_input,
                     bool accumulate);
// linear_backward's two halves, for a caller that runs something between them. The activation's:
// grad_pre = d loss / d pre (GELU's backward, or grad_output itself: then grad_pre is returned
// as grad_output), and the column sums of it into `bias_grad`. The products': grad_input (if
// not null) and the weight gradient, from d loss / d pre of `rows` rows. With `amax`, a layer
// with a GELU also takes the largest |grad_pre| (Kernels::gelu_backward_amax).
const void* linear_backward_activation(Kernels& kernels, const LinearLayer& layer, const void* pre,
                                       const void* grad_output, std::int64_t rows, void* grad_pre,
                                       void* bias_grad, bool accumulate, std::optional<float*> amax = std::nullopt);
// Which products' gradients linear_backward_matmul computes: both, or one of them (a split
// backward's B or W).
enum class ProductGradients { both, input, weight };
void linear_backward_matmul(Kernels& kernels, const LinearLayer& layer, const void* input, const void* grad_pre,
                            std::int64_t rows, void* grad_input, bool accumulate,
                            ProductGradients which = ProductGradients::both);

}  // namespace mlptrain
