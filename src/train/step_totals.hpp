// The world sums a step needs every rank to agree on, as named values: the loss and the correct
// predictions (each counted where the loss is computed, once per tensor-parallel group), the
// squared gradient norm (each element counted by one copy), how many ranks failed to read their
// samples, how many ranks are still writing a checkpoint, and with MoE layers the routing figures (the auxiliary loss, dropped assignments and
// every expert's load in every MoE layer, counted once: they are global already). They travel as
// one all-reduce of doubles, so every rank takes the same decisions from them.
#pragma once

#include <vector>

#include "comm/communicator.hpp"

namespace mlptrain {

struct StepTotals {
  double loss_sum = 0;
  double correct = 0;
  double grad_square_sum = 0;
  double read_problems = 0;
  double data_wait_ms = 0;  // summed over ranks
  double checkpoint_writers = 0;  // ranks whose checkpoint writes are still going on
  double stop_requests = 0;       // ranks that received a stop signal (stop_signals.hpp)
  double aux_loss = 0;
  double dropped = 0;
  std::vector<std::vector<double>> expert_load;  // per MoE layer: assignments per expert

  // Sums every rank's totals over `world` (nothing to do in one process). Collective.
  void sum_over(Communicator& world);
  bool finite() const;
};

}  // namespace mlptrain
