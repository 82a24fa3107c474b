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

}  // namespace mlptrain
