// fp16 loss scaling (see loss_scaler.hpp).
#include "optimizer/loss_scaler.hpp"

#include <algorithm>

namespace mlptrain {

LossScaler::LossScaler(const Config& config)
    : scales_(config.precision.types().scales_loss()), dynamic_(scales_ && config.precision.loss_scale == 0) {
  if (!scales_) return;
  scale_ = dynamic_ ? config.precision.initial_loss_scale : config.precision.loss_scale;
  min_scale_ = config.precision.min_loss_scale;
  window_ = config.precision.loss_scale_window;
}

void LossScaler::finite_step() {
  if (!dynamic_) return;
  if (++finite_in_window_ < window_) return;
  scale_ *= 2;
  finite_in_window_ = 0;
}

void LossScaler::overflowed_step() {
  ++skipped_steps_;
  finite_in_window_ = 0;
  scale_ = std::max(scale_ / 2, min_scale_);
}

}  // namespace mlptrain
