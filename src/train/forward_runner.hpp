// A micro-batch's forward through a chunk's layers, with the strategies' hooks around each layer:
// a layer computes on the rows its before-hooks give it (the rows it received, unless a strategy
// substitutes others), and its outputs have the rows they say (the same, unless a strategy
// splits them); they are allocated for those rows and the next layer receives them. Forward
// keeps what the recomputation plan says backward reads; a backward that recomputes a layer runs
// the same layer forward again.
#pragma once

#include <cstdint>
#include <functional>

#include "model/recompute_plan.hpp"
#include "train/chunk_layers.hpp"

namespace mlptrain {

class ForwardRunner {
 public:
  struct Pass {
    int micro_batch = 0;
    int micro_batches = 1;
    bool training = true;
    bool recomputing = false;  // in backward, for a layer whose activations forward dropped
  };

  ForwardRunner(const RunnerTools& tools, const ChunkLayers& layers, const RecomputePlan& plan)
      : tools_(tools), layers_(layers), plan_(plan) {}

  // Forward through every local layer, dropping what backward will not read (or will recompute).
  void forward(MicroBatchActivations& activations, const Pass& pass);
  // Layer `local` forward from the input it receives, into its pre-activation and output
  // (allocated for its rows unless kept); the output goes to `scratch` when given (a recomputed
  // segment's last layer, whose output backward does not read).
  void layer(MicroBatchActivations& activations, std::size_t local, void* scratch, const Pass& pass);

  // Called with a layer's index before each forward of it reads its parameters (whose values may
  // still be arriving: an offloaded update runs into the next forward).
  void set_gate(std::function<void(int layer)> gate) { gate_ = std::move(gate); }
  // The routing statistics of the training forwards since the last call (MoE layers).
  MoeStatistics take_moe_statistics();
  // The most activation memory a training micro-batch's MoE layers kept so far (0: none ran).
  std::int64_t largest_moe_bytes() const { return largest_moe_bytes_; }

 private:
  const RunnerTools tools_;
  const ChunkLayers& layers_;
  const RecomputePlan& plan_;
  std::function<void(int layer)> gate_;
  MoeStatistics moe_statistics_;
  std::int64_t largest_moe_bytes_ = 0;
};

}  // namespace mlptrain
