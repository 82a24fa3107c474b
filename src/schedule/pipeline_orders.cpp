// The computations of each pipeline schedule, in a stage's order (see schedule.hpp), and each
// schedule's theory of what a stage keeps in flight. Transfers are placed among them by
// schedule.cpp.
#include "schedule/pipeline_orders.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mlptrain {

namespace {

std::vector<Action> gpipe_order(const PipelineShape& shape) {
  std::vector<Action> order;
  for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch)
    order.push_back({ActionKind::forward, micro_batch});
  for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch)
    order.push_back({ActionKind::backward, micro_batch});
  return order;
}

std::vector<Action> one_f_one_b_order(const PipelineShape& shape, int stage) {
  std::vector<Action> order;
  const int micro_batches = shape.micro_batches;
  const int warmup = one_f_one_b_warmup(shape.stages, stage, micro_batches);
  for (int micro_batch = 0; micro_batch < warmup; ++micro_batch) order.push_back({ActionKind::forward, micro_batch});
  for (int steady = 0; steady < micro_batches - warmup; ++steady) {
    order.push_back({ActionKind::forward, warmup + steady});
    order.push_back({ActionKind::backward, steady});
  }
  for (int micro_batch = micro_batches - warmup; micro_batch < micro_batches; ++micro_batch)
    order.push_back({ActionKind::backward, micro_batch});
  return order;
}

// Megatron-LM's interleaved order (forward_backward_pipelining_with_interleaving): the k-th
// forward of a stage works on micro-batch (k / PV) P + k mod P of chunk (k mod PV) / P, the k-th
// backward on the same micro-batch of chunk V - 1 - (k mod PV) / P; 2(P - s - 1) + (V - 1)P
// forwards warm up, then one forward and one backward alternate, then the backwards drain.
std::vector<Action> interleaved_order(const PipelineShape& shape, int stage) {
  const int stages = shape.stages, chunks = shape.chunks;
  const int total = shape.micro_batches * chunks;
  const auto micro_batch_of = [&](int k) { return k / (stages * chunks) * stages + k % stages; };
  const auto forward = [&](int k) { return Action{ActionKind::forward, micro_batch_of(k), k % (stages * chunks) / stages}; };
  const auto backward = [&](int k) {
    return Action{ActionKind::backward, micro_batch_of(k), chunks - 1 - k % (stages * chunks) / stages};
  };
  const int warmup = std::min(total, theoretical_peak_in_flight(ScheduleKind::interleaved, shape, stage) - 1);
  std::vector<Action> order;
  for (int k = 0; k < warmup; ++k) order.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(forward(warmup + k));
    order.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backward(k));
  return order;
}

// Zero-bubble H1 (Qi et al., 2023, section 3.1): 1F1B's warm-up, then F, B and W in turn with
// each stage's W running s micro-batches behind its B (stage s defers s W's), then the remaining
// B's and W's. Deferring W lets each B, the critical path, run as soon as its gradient arrives,
// and the deferred W's fill the tail where 1F1B idles; a stage then keeps at most P micro-batches
// in flight (forward done, W not yet): 1F1B's peak, that of its first stage. Every kind runs in
// micro-batch order.
std::vector<Action> zero_bubble_h1_order(const PipelineShape& shape, int stage) {
  const int micro_batches = shape.micro_batches;
  const int warmup = one_f_one_b_warmup(shape.stages, stage, micro_batches);
  std::vector<Action> order;
  for (int micro_batch = 0; micro_batch < warmup; ++micro_batch) order.push_back({ActionKind::forward, micro_batch});
  for (int k = 0; k < micro_batches; ++k) {
    if (warmup + k < micro_batches) order.push_back({ActionKind::forward, warmup + k});
    order.push_back({ActionKind::backward_input, k});
    if (k >= stage) order.push_back({ActionKind::backward_weight, k - stage});
  }
  for (int micro_batch = std::max(0, micro_batches - stage); micro_batch < micro_batches; ++micro_batch)
    order.push_back({ActionKind::backward_weight, micro_batch});
  return order;
}

}  // namespace

int one_f_one_b_warmup(int stages, int stage, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches);
}

std::string schedule_shape_problem(ScheduleKind kind, const PipelineShape& shape) {
  if (shape.stages < 1 || shape.chunks < 1 || shape.micro_batches < 1)
    return "stages, chunks and micro-batches must be at least 1";
  if (kind != ScheduleKind::interleaved)
    return shape.chunks == 1 ? "" : std::string(schedule_kind_name(kind)) + " holds one chunk per stage";
  if (shape.chunks > 1 && shape.stages < 2) return "interleaving chunks needs at least 2 stages";
  if (shape.chunks > 1 && shape.micro_batches % shape.stages != 0)
    return "the micro-batches (" + std::to_string(shape.micro_batches) + ") must be a multiple of the stages (" +
           std::to_string(shape.stages) + "): they go round the stages in groups of P (Megatron-LM's rule)";
  return "";
}

int theoretical_peak_in_flight(ScheduleKind kind, const PipelineShape& shape, int stage) {
  const int stages = shape.stages, micro_batches = shape.micro_batches;
  switch (kind) {
    case ScheduleKind::gpipe: return micro_batches;
    case ScheduleKind::one_f_one_b: return std::min(micro_batches, stages - stage);
    case ScheduleKind::zero_bubble_h1: return std::min(micro_batches, stages);
    case ScheduleKind::interleaved:
      if (shape.chunks == 1) return std::min(micro_batches, stages - stage);  // 1F1B
      return std::min(micro_batches * shape.chunks, 2 * (stages - stage - 1) + (shape.chunks - 1) * stages + 1);
  }
  return 0;
}

double theoretical_bubble(ScheduleKind kind, const PipelineShape& shape) {
  const double idle = shape.stages - 1, micro_batches = shape.micro_batches;
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return idle / (micro_batches + idle);
    case ScheduleKind::interleaved: return idle / (shape.chunks * micro_batches + idle);
    case ScheduleKind::zero_bubble_h1: return idle / (3 * micro_batches + idle);
  }
  return 0;
}

std::string_view bubble_formula(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return "(P-1)/(M+P-1)";
    case ScheduleKind::interleaved: return "(P-1)/(VM+P-1)";
    case ScheduleKind::zero_bubble_h1: return "(P-1)/(3M+P-1) with F = B = W";
  }
  return "";
}

std::vector<Action> computation_order(ScheduleKind kind, const PipelineShape& shape, int stage) {
  if (const std::string problem = schedule_shape_problem(kind, shape); !problem.empty())
    throw std::logic_error("pipeline schedule: " + problem);
  switch (kind) {
    case ScheduleKind::gpipe: return gpipe_order(shape);
    case ScheduleKind::one_f_one_b: return one_f_one_b_order(shape, stage);
    case ScheduleKind::interleaved:
      return shape.chunks == 1 ? one_f_one_b_order(shape, stage) : interleaved_order(shape, stage);
    case ScheduleKind::zero_bubble_h1: return zero_bubble_h1_order(shape, stage);
  }
  return {};
}

}  // namespace mlptrain
