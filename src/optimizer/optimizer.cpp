// AdamW, schedules and clipping helpers (see optimizer.hpp).
#include "optimizer/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace mlptrain {

double scheduled_learning_rate(const Config& config, std::int64_t step) {
  const auto warmup = static_cast<std::int64_t>(config.training.warmup_steps);
  if (step < warmup) return config.training.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (config.training.lr_schedule == LearningRateSchedule::constant) return config.training.lr;
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<std::int64_t>(config.training.steps - warmup, 1));
  return config.training.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_coefficient(double max_norm, double total_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

AdamW::AdamW(const Config& config, Allocator& device, StatePlacement& placement, HostSide* offload)
    : config_(config) {
  const std::size_t total = placement.moment_count;
  const Precision& precision = placement.precision;
  Allocator& allocator = offload != nullptr ? *offload->memory : device;
  const auto zeroed = [&](MemoryState state, std::size_t count, DataType type) {
    Buffer buffer = allocator.allocate_elements(state, count, type);
    buffer.fill_zero();
    return buffer;
  };
  if (precision.keeps_master()) master_ = zeroed(MemoryState::optimizer, total, DataType::float32);
  exp_avg_ = zeroed(MemoryState::optimizer, total, DataType::float32);
  exp_avg_sq_ = zeroed(MemoryState::optimizer, total, DataType::float32);
  for (StateRange& run : placement.updated) {
    run.master = precision.keeps_master() ? master_.floats() + run.moment_offset : static_cast<float*>(run.values);
    run.exp_avg = exp_avg_.floats() + run.moment_offset;
    run.exp_avg_sq = exp_avg_sq_.floats() + run.moment_offset;
  }
  if (offload != nullptr) {
    // The host updates fp32 masters: the device's values themselves, copied down each step, or
    // the masters it keeps, whose rounded copy goes up.
    host_values_ = zeroed(MemoryState::workspace, total, precision.keeps_master() ? precision.param : DataType::float32);
    host_grads_ = zeroed(MemoryState::workspace, total, precision.reduce);
    offloaded_ = std::make_unique<OffloadedUpdate>(
        device, *offload->kernels, placement.updated,
        OffloadedUpdate::HostState{.master = precision.keeps_master() ? master_.floats() : host_values_.floats(),
                                   .compute_copy = precision.keeps_master() ? host_values_.as<void>() : nullptr,
                                   .grads = host_grads_.as<void>(),
                                   .exp_avg = exp_avg_.floats(),
                                   .exp_avg_sq = exp_avg_sq_.floats(),
                                   .precision = precision});
  }
}

double AdamW::owned_square_sum(Kernels& kernels, const StatePlacement& placement, Field field) {
  const bool grads = field == Field::grads;
  const DataType type = grads ? placement.precision.reduce : placement.precision.param;
  double sum = 0;
  for (const StateRange& run : placement.updated)
    if (counts_in_norms(run)) sum += kernels.sum_of_squares(grads ? run.grads : run.values, type, static_cast<std::size_t>(run.count));
  return sum;
}

double AdamW::update(Kernels& kernels, const StatePlacement& placement, double learning_rate, std::int64_t step,
                     float grad_scale) {
  const AdamWStep settings{.learning_rate = learning_rate,
                           .beta1 = config_.training.beta1,
                           .beta2 = config_.training.beta2,
                           .eps = config_.training.eps,
                           .weight_decay = config_.training.weight_decay,
                           .step = step,
                           .grad_scale = grad_scale};
  if (offloaded_) {
    // The device's own pass over the gradients gives their norm now (the same sum the host's
    // update would form), before the host thread takes its time over the update.
    const double owned_sum = owned_square_sum(kernels, placement);
    offloaded_->start(settings);
    return owned_sum * static_cast<double>(grad_scale) * grad_scale;
  }
  const Precision& precision = placement.precision;
  std::vector<AdamWRange> ranges;
  ranges.reserve(placement.updated.size());
  for (const StateRange& run : placement.updated)
    ranges.push_back({.master = run.master, .grads = run.grads, .exp_avg = run.exp_avg, .exp_avg_sq = run.exp_avg_sq,
                      .count = static_cast<std::size_t>(run.count),
                      .compute_copy = precision.keeps_master() ? run.values : nullptr,
                      .counted = counts_in_norms(run)});
  return kernels.adamw(ranges, precision.reduce, settings, precision.param);
}

}  // namespace mlptrain
