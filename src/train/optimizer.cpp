// AdamW, schedules and clipping helpers (see optimizer.hpp).
#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mlptrain {

double scheduled_learning_rate(const Config& config, std::int64_t step) {
  const auto warmup = static_cast<std::int64_t>(config.warmup_steps);
  if (step < warmup) return config.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (config.lr_schedule == "constant") return config.lr;
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<std::int64_t>(config.steps - warmup, 1));
  return config.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_coefficient(double max_norm, double total_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

AdamW::AdamW(const Config& config, Allocator& allocator, std::size_t parameter_count)
    : config_(config),
      exp_avg_(allocator.allocate_floats(MemoryState::optimizer, parameter_count)),
      exp_avg_sq_(allocator.allocate_floats(MemoryState::optimizer, parameter_count)) {
  std::fill_n(exp_avg(), parameter_count, 0.0f);
  std::fill_n(exp_avg_sq(), parameter_count, 0.0f);
}

double AdamW::owned_square_sum(Kernels& kernels, const ParameterStore& parameters,
                               const GridShape& shape, const GridCoordinates& place) {
  double sum = 0;
  for (const ParameterTensor& tensor : parameters.tensors())
    if (ParameterStore::owns(tensor, shape, place))
      sum += kernels.sum_of_squares(parameters.grads() + tensor.offset, tensor.count);
  return sum;
}

double AdamW::update(Kernels& kernels, ParameterStore& parameters, double learning_rate,
                     std::int64_t step, const GridShape& shape, const GridCoordinates& place) {
  const AdamWStep settings{.learning_rate = learning_rate,
                           .beta1 = config_.beta1,
                           .beta2 = config_.beta2,
                           .eps = config_.eps,
                           .weight_decay = config_.weight_decay,
                           .step = step};
  double owned_sum = 0;
  for (const ParameterTensor& tensor : parameters.tensors()) {
    const std::size_t at = tensor.offset;
    const double sum = kernels.adamw(parameters.values() + at, parameters.grads() + at,
                                     exp_avg() + at, exp_avg_sq() + at, tensor.count, settings);
    if (ParameterStore::owns(tensor, shape, place)) owned_sum += sum;
  }
  return owned_sum;
}

}  // namespace mlptrain
