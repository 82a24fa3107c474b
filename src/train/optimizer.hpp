// AdamW over the flat parameter buffer exactly as torch.optim.AdamW (one parameter group), the
// learning-rate schedules of DESIGN.md §2.1, and the pieces of global-norm clipping: every rank
// sums the squares of the gradients it owns (each replicated element is owned by one replica),
// the trainer sums those over the world.
#pragma once

#include <cstdint>

#include "comm/process_grid.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "kernels/kernels.hpp"
#include "model/parameter_store.hpp"

namespace mlptrain {

// lr of the optimizer step with 0-based index `step`.
double scheduled_learning_rate(const Config& config, std::int64_t step);

// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: min(1, clip / (norm + 1e-6)).
double clip_coefficient(double max_norm, double total_norm);

class AdamW {
 public:
  AdamW(const Config& config, Allocator& allocator, std::size_t parameter_count);

  float* exp_avg() const { return exp_avg_.floats(); }
  float* exp_avg_sq() const { return exp_avg_sq_.floats(); }

  // Sum of squares of the gradients this rank owns.
  static double owned_square_sum(Kernels& kernels, const ParameterStore& parameters,
                                 const GridShape& shape, const GridCoordinates& place);

  // One update of every local parameter as optimizer step `step` (counting from 1). Returns the
  // sum of squares of the owned gradients it read.
  double update(Kernels& kernels, ParameterStore& parameters, double learning_rate,
                std::int64_t step, const GridShape& shape, const GridCoordinates& place);

 private:
  const Config& config_;
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
};

}  // namespace mlptrain
