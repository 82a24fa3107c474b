// The views a layer's backward hooks receive (LayerHooks, capabilities.hpp), for each part of a
// backward split into the input gradient (B) and the weight gradients (W), or for the whole.
#pragma once

#include <cstdint>
#include <optional>

#include "strategies/forward_views.hpp"

namespace mlptrain {

// Which part of a layer's backward a call is: all of it, or (a zero-bubble schedule's B and W,
// run as separate actions) the input gradient alone, then the parameter gradients alone.
enum class BackwardPart { whole, input, weight };

// before_layer_backward: the rows the forward computed on, the layer's unit, and what this part
// of the backward reads and writes: the input its weight gradients need (whole and W; B reads
// none) and where d loss / d input goes (whole and B; the model's first layer computes none). A
// hook that substituted the forward's input substitutes it again, with where the input gradient
// of the substituted rows goes, and maps that back into grad_input after the layer.
class BackwardStart : public LayerCall {
 public:
  BackwardStart(const LayerCall& call, BackwardPart part, std::int64_t rows, std::int64_t layer_rows,
                std::int64_t output_rows, UnitMemory unit, std::optional<const void*> input,
                std::optional<void*> grad_input)
      : LayerCall(call), part(part), rows(rows), layer_rows(layer_rows), output_rows(output_rows), unit(unit),
        input(input), grad_input(grad_input), layer_input_(input), layer_grad_input_(grad_input) {}

  const BackwardPart part;
  const std::int64_t rows;         // received in forward
  const std::int64_t layer_rows;   // computed on in forward
  const std::int64_t output_rows;  // of pre and the output
  UnitMemory unit;
  const std::optional<const void*> input;  // [rows, in]
  const std::optional<void*> grad_input;   // [rows, in]

  // What the layer computes on instead (ignored where this part reads no input) and where the
  // input gradient of those rows goes (ignored where it computes none).
  void substitute_input(const void* rows_data, void* grad_rows) {
    if (layer_input_) layer_input_ = rows_data;
    if (layer_grad_input_) layer_grad_input_ = grad_rows;
  }
  std::optional<const void*> layer_input() const { return layer_input_; }
  std::optional<void*> layer_grad_input() const { return layer_grad_input_; }

 private:
  std::optional<const void*> layer_input_;
  std::optional<void*> layer_grad_input_;
};

// before_layer_matmul_backward: the activation's backward is done. `grad_pre` holds d loss /
// d pre ([output_rows, out]), and `grad_product` must hold d loss / d product ([layer_rows, out])
// when the hooks return: the same memory unless the rows differ (the hook that split them fills
// it).
struct BackwardProduct : LayerCall {
  BackwardPart part;
  std::int64_t layer_rows;
  std::int64_t output_rows;
  const void* grad_pre;
  void* grad_product;
};

// after_layer_backward: this part's gradients are complete. Where it computed an input
// gradient, `computed` holds it for the rows the layer computed on ([layer_rows, in]) and
// `destination` is where the rows the layer received want it ([rows, in]): the same memory unless
// a before-hook substituted the input, which then maps one into the other here.
struct InputGradient {
  void* computed;
  void* destination;
};
struct BackwardDone : LayerCall {
  BackwardPart part;
  std::int64_t rows;
  std::int64_t layer_rows;
  std::optional<InputGradient> input_gradient;
};

}  // namespace mlptrain
