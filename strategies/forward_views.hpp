// The views a layer's forward hooks receive (LayerHooks, capabilities.hpp): at each point, what
// is valid there and nothing else, which layer of which micro-batch it is, and what a hook may
// substitute or split.
#pragma once

#include <cstdint>
#include <optional>

#include "core/data_type.hpp"
#include "model/model_spec.hpp"

namespace mlptrain {

// The hooks of a layer receive views of what is valid at their point and nothing else. Every
// view says which layer of which micro-batch it is (LayerCall); activations and their gradients
// are this rank's local tensors, of `activation_type` (the run's param type). A layer computes on
// its `layer_rows` rows of `layer_input`: the rows it received unless a before-hook substitutes
// others (rows gathered from a group, say); its outputs may have other rows still
// (`output_rows`: a sum over a group split into row blocks). The runner sizes every buffer from
// those counts, in forward, backward and recomputation alike.
struct LayerCall {
  int layer;
  int micro_batch;
  int micro_batches;
  bool training;  // false while evaluating
  DataType activation_type;
  const LayerSpec& spec;

  bool last_micro_batch() const { return micro_batch == micro_batches - 1; }
};

// Where this use of a layer reads its parameters and writes their gradients: its unit (the
// layer's tensors in the store's layout, from the unit's first element), the store's own unless
// a before-hook points either elsewhere (a gathered copy of sharded parameters, a transient
// gradient buffer laid out alike), and whether the gradients add to what is there.
struct UnitMemory {
  void* values;
  void* grads;
  bool accumulate_grads;  // later micro-batches add; the first overwrites
};

// before_layer_forward: the layer's input and rows, which a hook may substitute or split, and
// its unit. The bias goes into the product unless a hook sums partial products first
// (add_bias_after_sum: that hook then adds it, in fp32 before the sum is rounded, §2.7).
class ForwardStart : public LayerCall {
 public:
  ForwardStart(const LayerCall& call, bool recomputing, std::int64_t rows, const void* input, UnitMemory unit)
      : LayerCall(call), recomputing(recomputing), rows(rows), input(input), unit(unit), layer_rows_(rows),
        layer_input_(input) {}

  // A forward run again in backward (--recompute) for activations the first forward dropped:
  // the same computation, so the same hooks, but the layer's backward follows right after.
  const bool recomputing;
  const std::int64_t rows;   // received
  const void* const input;   // [rows, in]
  UnitMemory unit;

  void substitute_input(const void* rows_data, std::int64_t count) {
    layer_input_ = rows_data;
    layer_rows_ = count;
  }
  // The outputs keep `count` of the rows the layer computes on (a block of a split sum).
  void split_output_rows(std::int64_t count) { output_rows_ = count; }
  void add_bias_after_sum() { bias_after_sum_ = true; }

  std::int64_t layer_rows() const { return layer_rows_; }
  const void* layer_input() const { return layer_input_; }
  std::int64_t output_rows() const { return output_rows_.value_or(layer_rows_); }
  bool bias_after_sum() const { return bias_after_sum_; }

 private:
  std::int64_t layer_rows_;
  const void* layer_input_;
  std::optional<std::int64_t> output_rows_;
  bool bias_after_sum_ = false;
};

// after_layer_matmul: the matrix product is done. `product` holds x W^T ([layer_rows, out], + b
// unless a before-hook moved the bias after its sum), and `pre` must hold what the activation
// applies to ([output_rows, out], bias included) when the hooks return: the same memory unless
// the rows differ (the hook that split them fills pre from product). An MoE layer's product is its
// experts' combined output.
struct ForwardProduct : LayerCall {
  std::int64_t layer_rows;
  std::int64_t output_rows;
  void* product;
  void* pre;
  std::optional<const void*> bias_after_sum;  // the bias to add after the sum, where a hook moved it
};

// after_layer_forward: the layer's output is complete (what it computed on can be let go).
struct ForwardDone : LayerCall {};

}  // namespace mlptrain
