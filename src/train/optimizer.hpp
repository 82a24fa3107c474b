// AdamW exactly as torch.optim.AdamW (one parameter group), the learning-rate schedules of
// DESIGN.md §2.1, and the pieces of global-norm clipping: every rank sums the squares of the
// gradients it owns (each element is owned by one rank), the trainer sums those over the world.
#pragma once

#include <cstdint>

#include "core/buffer.hpp"
#include "core/config.hpp"
#include "kernels/kernels.hpp"
#include "model/state_runs.hpp"

namespace mlptrain {

// lr of the optimizer step with 0-based index `step`.
double scheduled_learning_rate(const Config& config, std::int64_t step);

// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: min(1, clip / (norm + 1e-6)).
double clip_coefficient(double max_norm, double total_norm);

// AdamW over the runs a rank updates: it owns their moments (laid out as the placement says,
// charged to the ledger as optimizer state) and points each run at its share of them.
class AdamW {
 public:
  AdamW(const Config& config, Allocator& allocator, StatePlacement& placement);

  // Sum of squares of the owned runs' gradients (or values).
  enum class Field { grads, values };
  static double owned_square_sum(Kernels& kernels, const std::vector<StateRun>& runs,
                                 Field field = Field::grads);
  static void scale_grads(Kernels& kernels, const std::vector<StateRun>& runs, float factor);

  // One update of every run as optimizer step `step` (counting from 1). Returns the sum of
  // squares of the owned gradients it read.
  double update(Kernels& kernels, const std::vector<StateRun>& runs, double learning_rate,
                std::int64_t step) const;

 private:
  const Config& config_;
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
};

}  // namespace mlptrain
