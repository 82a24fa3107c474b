// The floating-point work of a training step, counted as Megatron-LM and torchtitan count it for
// model FLOP utilization: 2 FLOPs per multiply-add and three passes over every parameter a sample
// touches (forward, and backward's input- and weight-gradient GEMMs), so 6 per parameter and
// sample; an MoE layer counts its router and the k experts each token visits. Recomputation's
// second forward is counted apart: work the hardware does, not progress of the model.
#pragma once

#include <vector>

#include "model/model_spec.hpp"

namespace mlptrain {

struct StepFlops {
  double model = 0;      // 6 x parameters a sample touches x samples
  double recompute = 0;  // 2 x multiply-adds of the recomputed layers x samples
};

double model_flops_per_sample(const std::vector<LayerSpec>& model);

// The forward FLOPs per sample that recomputation runs again on one stage's layers (those whose
// pre-activations forward drops).
double recompute_flops_per_sample(const std::vector<LayerSpec>& stage_layers, bool recompute);

// Memory-bound work of one layer per sample, in elements. Bias/GELU passes: forward one per
// output element (an MoE layer's k experts' each), backward two. Rows an MoE layer moves (the
// k rows of each token): forward gathers them into expert order and sums the experts' outputs
// back into each token's row, written once; backward gathers the output gradient, dots it with
// the returned rows and sums the input gradient into fp32 rows, which the router's part is added
// to and which are then rounded; with experts on several ranks each exchange also regroups its
// rows by expert, and back.
// An MoE layer's tensor ranks split its experts among them and each keeps the assignments of its
// own, so the k rows a token sends are shared among them; the input gradient's sums (and the
// router) are each rank's whole. `expert_share` scales the rows a rank's experts get (balanced
// routing: 1; the busiest rank's: its rows over the mean).
struct LayerPasses {
  double elementwise_forward = 0;
  double elementwise_backward = 0;
  double moved_forward = 0;
  double moved_backward = 0;

  LayerPasses& operator+=(const LayerPasses& other) {
    elementwise_forward += other.elementwise_forward;
    elementwise_backward += other.elementwise_backward;
    moved_forward += other.moved_forward;
    moved_backward += other.moved_backward;
    return *this;
  }
};
LayerPasses layer_passes(const LayerSpec& layer, int expert_ranks, int tensor_ranks, double expert_share = 1.0);

// The multiply-adds per sample one tensor rank does for a layer of its local shape: a Linear
// layer's slice as it is; an MoE layer's router whole and its tensor rank's share of the k
// experts' GEMMs (times `expert_share`, as above).
double local_multiply_adds(const LayerSpec& layer, int tensor_ranks, double expert_share = 1.0);

}  // namespace mlptrain
