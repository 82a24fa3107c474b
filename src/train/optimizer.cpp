// AdamW, schedules and clipping helpers (see optimizer.hpp).
#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mlptrain {

double scheduled_learning_rate(const Config& config, std::int64_t step) {
  const auto warmup = static_cast<std::int64_t>(config.warmup_steps);
  if (step < warmup) return config.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (config.lr_schedule == LearningRateSchedule::constant) return config.lr;
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<std::int64_t>(config.steps - warmup, 1));
  return config.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_coefficient(double max_norm, double total_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

AdamW::AdamW(const Config& config, Allocator& device, StatePlacement& placement, HostSide* offload)
    : config_(config) {
  const std::size_t total = placement.moment_count;
  Allocator& allocator = offload != nullptr ? *offload->memory : device;
  exp_avg_ = allocator.allocate_floats(MemoryState::optimizer, total);
  exp_avg_sq_ = allocator.allocate_floats(MemoryState::optimizer, total);
  exp_avg_.fill_zero();
  exp_avg_sq_.fill_zero();
  for (StateRun& run : placement.updated) {
    run.exp_avg = exp_avg_.floats() + run.moment_offset;
    run.exp_avg_sq = exp_avg_sq_.floats() + run.moment_offset;
  }
  if (offload != nullptr) {
    host_values_ = allocator.allocate_floats(MemoryState::workspace, total);
    host_grads_ = allocator.allocate_floats(MemoryState::workspace, total);
    offloaded_ = std::make_unique<OffloadedUpdate>(device, *offload->kernels, placement.updated,
                                                   host_values_.floats(), host_grads_.floats(),
                                                   exp_avg_.floats(), exp_avg_sq_.floats());
  }
}

double AdamW::owned_square_sum(Kernels& kernels, const std::vector<StateRun>& runs, Field field) {
  double sum = 0;
  for (const StateRun& run : runs)
    if (run.owned)
      sum += kernels.sum_of_squares(field == Field::grads ? run.grads : run.values,
                                    static_cast<std::size_t>(run.count));
  return sum;
}

void AdamW::scale_grads(Kernels& kernels, const std::vector<StateRun>& runs, float factor) {
  for (const StateRun& run : runs) kernels.scale(run.grads, static_cast<std::size_t>(run.count), factor);
}

double AdamW::update(Kernels& kernels, const std::vector<StateRun>& runs, double learning_rate,
                     std::int64_t step) {
  const AdamWStep settings{.learning_rate = learning_rate,
                           .beta1 = config_.beta1,
                           .beta2 = config_.beta2,
                           .eps = config_.eps,
                           .weight_decay = config_.weight_decay,
                           .step = step};
  if (offloaded_) {
    // The device's own pass over the gradients gives their norm now (the same sum the host's
    // update would form), before the host thread takes its time over the update.
    const double owned_sum = owned_square_sum(kernels, runs);
    offloaded_->start(settings);
    return owned_sum;
  }
  double owned_sum = 0;
  for (const StateRun& run : runs) {
    const double sum = kernels.adamw(run.values, run.grads, run.exp_avg, run.exp_avg_sq,
                                     static_cast<std::size_t>(run.count), settings);
    if (run.owned) owned_sum += sum;
  }
  return owned_sum;
}

}  // namespace mlptrain
