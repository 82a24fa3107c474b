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

namespace {

// Runs that follow each other in values, gradients and moments at once, merged: what an
// offloaded update copies in one piece (usually a whole flat buffer).
struct ContiguousSpan {
  float* values;
  float* grads;
  std::size_t moment_offset;
  std::size_t count;
};

std::vector<ContiguousSpan> contiguous_spans(const std::vector<StateRun>& runs) {
  std::vector<ContiguousSpan> spans;
  for (const StateRun& run : runs) {
    const auto count = static_cast<std::size_t>(run.count);
    if (count == 0) continue;
    if (!spans.empty()) {
      ContiguousSpan& last = spans.back();
      if (last.values + last.count == run.values && last.grads + last.count == run.grads &&
          last.moment_offset + last.count == run.moment_offset) {
        last.count += count;
        continue;
      }
    }
    spans.push_back({run.values, run.grads, run.moment_offset, count});
  }
  return spans;
}

}  // namespace

AdamW::AdamW(const Config& config, Allocator& device, StatePlacement& placement, HostSide* offload)
    : config_(config), device_(device), offload_(offload) {
  const std::size_t total = placement.moment_count;
  Allocator& allocator = offload_ != nullptr ? *offload_->memory : device_;
  exp_avg_ = allocator.allocate_floats(MemoryState::optimizer, total);
  exp_avg_sq_ = allocator.allocate_floats(MemoryState::optimizer, total);
  if (offload_ != nullptr) {
    host_values_ = allocator.allocate_floats(MemoryState::workspace, total);
    host_grads_ = allocator.allocate_floats(MemoryState::workspace, total);
  }
  exp_avg_.fill_zero();
  exp_avg_sq_.fill_zero();
  for (StateRun& run : placement.updated) {
    run.exp_avg = exp_avg_.floats() + run.moment_offset;
    run.exp_avg_sq = exp_avg_sq_.floats() + run.moment_offset;
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
                     std::int64_t step) const {
  const AdamWStep settings{.learning_rate = learning_rate,
                           .beta1 = config_.beta1,
                           .beta2 = config_.beta2,
                           .eps = config_.eps,
                           .weight_decay = config_.weight_decay,
                           .step = step};
  if (offload_ != nullptr) return update_on_host(runs, settings);
  double owned_sum = 0;
  for (const StateRun& run : runs) {
    const double sum = kernels.adamw(run.values, run.grads, run.exp_avg, run.exp_avg_sq,
                                     static_cast<std::size_t>(run.count), settings);
    if (run.owned) owned_sum += sum;
  }
  return owned_sum;
}

double AdamW::update_on_host(const std::vector<StateRun>& runs, const AdamWStep& settings) const {
  float* values = host_values_.floats();
  float* grads = host_grads_.floats();
  const std::vector<ContiguousSpan> spans = contiguous_spans(runs);
  for (const ContiguousSpan& span : spans) {
    device_.copy_any_to_host(values + span.moment_offset, span.values, span.count * sizeof(float));
    device_.copy_any_to_host(grads + span.moment_offset, span.grads, span.count * sizeof(float));
  }
  double owned_sum = 0;
  for (const StateRun& run : runs) {
    const double sum =
        offload_->kernels->adamw(values + run.moment_offset, grads + run.moment_offset, run.exp_avg,
                                 run.exp_avg_sq, static_cast<std::size_t>(run.count), settings);
    if (run.owned) owned_sum += sum;
  }
  for (const ContiguousSpan& span : spans)
    device_.copy_host_to_any(span.values, values + span.moment_offset, span.count * sizeof(float));
  return owned_sum;
}

}  // namespace mlptrain
