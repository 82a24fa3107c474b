// fp16's loss scaling (DESIGN.md §2.7), as PyTorch's GradScaler and Megatron-LM's dynamic scaler
// do it: the loss's gradient is multiplied by the scale so that small gradients survive fp16, and
// the optimizer divides it out in fp32. A dynamic scale halves (not below the minimum) after a
// step whose gradients overflowed anywhere, which is skipped, and doubles after a window of
// consecutive finite steps. A fixed scale never changes; a run without fp16 scales by 1.
#pragma once

#include <cstdint>

#include "core/config.hpp"

namespace mlptrain {

class LossScaler {
 public:
  explicit LossScaler(const Config& config);

  bool scales() const { return scales_; }
  bool dynamic() const { return dynamic_; }
  float scale() const { return static_cast<float>(scale_); }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  // Finite steps since the scale last changed (toward the window).
  std::int64_t finite_steps() const { return finite_in_window_; }

  // A step's gradients were all finite: counts toward the window (and may double the scale).
  void finite_step();
  // A step's gradients overflowed (dynamic scaling only): the step is skipped, the scale halves.
  void overflowed_step();
  // Where a checkpoint left the scale.
  void resume_at(double scale, std::int64_t finite_steps) {
    scale_ = scale;
    finite_in_window_ = finite_steps;
  }

 private:
  bool scales_ = false;
  bool dynamic_ = false;
  double scale_ = 1;
  double min_scale_ = 1;
  std::int64_t window_ = 0;
  std::int64_t finite_in_window_ = 0;
  std::int64_t skipped_steps_ = 0;
};

}  // namespace mlptrain
