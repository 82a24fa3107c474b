// The memory of one micro-batch on its way through a rank's layers: what forward keeps for
// backward, the loss's inputs and gradient, and the gradients that cross stage boundaries.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.hpp"
#include "model/fp8_linear.hpp"
#include "model/moe.hpp"

namespace mlptrain {

// What one micro-batch's forward keeps for its backward (charged as activations), and the
// gradients that cross a stage boundary (charged as comm_buffers: they exist for a transfer).
// Activations and their gradients are of the param type; targets and labels as read.
struct MicroBatchActivations {
  std::int64_t rows = 0;
  Buffer input;               // the first local layer's input
  std::vector<Buffer> pre;    // per local layer: x W^T + b
  std::vector<Buffer> output; // per local layer with a GELU: GELU(pre)
  Buffer targets;             // regression targets (where the loss is computed)
  Buffer labels;              // class labels (where the loss is computed)
  Buffer loss_grad;           // d loss / d model output (training only)
  Buffer output_grad;         // d loss / d local output, received from the next stage
  Buffer input_grad;          // d loss / d local input, for the previous stage
  std::vector<MoeActivations> moe;  // per local layer (used by MoE layers)
  std::vector<std::int64_t> layer_rows;   // per local layer: the rows it computed on
  std::vector<std::int64_t> output_rows;  // per local layer: the rows of its outputs
  // Per Linear layer, between a backward's B and W: d loss / d product ([layer_rows, out]),
  // which the weight gradients need.
  std::vector<Buffer> product_grad;
  // Per local layer under --fp8: the amax its products share (model/fp8_linear.hpp).
  std::vector<Fp8LayerAmax> fp8_amax;
};

}  // namespace mlptrain
