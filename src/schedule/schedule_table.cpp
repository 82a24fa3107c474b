// The table of pipeline schedules (see schedule_table.hpp): each schedule's order of a stage's
// computations and its theory. Transfers are placed among the computations by schedule.cpp.
#include "schedule/schedule_table.hpp"

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
// Megatron's warm-up plus one: min(MV, 2(P - s - 1) + (V - 1)P + 1); with V = 1, 1F1B's.
int interleaved_peak(const PipelineShape& shape, int stage) {
  const int stages = shape.stages, micro_batches = shape.micro_batches;
  if (shape.chunks == 1) return std::min(micro_batches, stages - stage);
  return std::min(micro_batches * shape.chunks, 2 * (stages - stage - 1) + (shape.chunks - 1) * stages + 1);
}

std::vector<Action> interleaved_order(const PipelineShape& shape, int stage) {
  if (shape.chunks == 1) return one_f_one_b_order(shape, stage);
  const int stages = shape.stages, chunks = shape.chunks;
  const int total = shape.micro_batches * chunks;
  const auto micro_batch_of = [&](int k) { return k / (stages * chunks) * stages + k % stages; };
  const auto forward = [&](int k) { return Action{ActionKind::forward, micro_batch_of(k), k % (stages * chunks) / stages}; };
  const auto backward = [&](int k) {
    return Action{ActionKind::backward, micro_batch_of(k), chunks - 1 - k % (stages * chunks) / stages};
  };
  const int warmup = std::min(total, interleaved_peak(shape, stage) - 1);
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

// Zero-bubble V (Qi et al., 2023, section 6), in the order of PyTorch's ScheduleZBVZeroBubble:
// stage s holds chunks s (local 0) and 2P - 1 - s (local 1). It warms up with 2(P - s) - 1
// forwards of chunk 0, then s pairs of forwards (chunk 1, chunk 0), then P - s rounds of chunk
// 1's F, B and W; in the steady state each round runs chunk 0's F (while any remain), B and W,
// then chunk 1's; it cools down with s pairs of B (chunk 0, chunk 1), P - s of chunk 0's B and
// W, and the deferred W's, chunk 1's first. The order is laid out for max(2P - 1, M)
// micro-batches and the ones beyond M dropped. Each kind runs in micro-batch order per chunk.
std::vector<Action> zero_bubble_v_order(const PipelineShape& shape, int stage) {
  const int stages = shape.stages, micro_batches = shape.micro_batches;
  const int laid_out = std::max(2 * stages - 1, micro_batches);
  int forwards[2] = {0, 0}, inputs[2] = {0, 0}, weights[2] = {0, 0};
  std::vector<Action> order;
  const auto add = [&](ActionKind kind, int chunk) {
    int& next = kind == ActionKind::forward ? forwards[chunk] : kind == ActionKind::backward_input ? inputs[chunk]
                                                                                                  : weights[chunk];
    if (next < micro_batches) order.push_back({kind, next, chunk});
    ++next;
  };
  const auto round = [&](int chunk) {
    add(ActionKind::backward_input, chunk);
    add(ActionKind::backward_weight, chunk);
  };
  for (int k = 0; k < 2 * (stages - stage) - 1; ++k) add(ActionKind::forward, 0);
  for (int k = 0; k < stage; ++k) {
    add(ActionKind::forward, 1);
    add(ActionKind::forward, 0);
  }
  for (int k = 0; k < stages - stage; ++k) {
    add(ActionKind::forward, 1);
    round(1);
  }
  while (forwards[1] < forwards[0] || forwards[0] < laid_out) {
    if (forwards[0] < laid_out) add(ActionKind::forward, 0);
    round(0);
    add(ActionKind::forward, 1);
    round(1);
  }
  for (int k = 0; k < stage; ++k) {
    add(ActionKind::backward_input, 0);
    add(ActionKind::backward_input, 1);
  }
  for (int k = 0; k < stages - stage; ++k) round(0);
  while (weights[1] < inputs[1]) add(ActionKind::backward_weight, 1);
  while (weights[0] < inputs[0]) add(ActionKind::backward_weight, 0);
  return order;
}

std::string interleaved_shape_problem(const PipelineShape& shape) {
  if (shape.chunks > 1 && shape.stages < 2) return "interleaving chunks needs at least 2 stages";
  if (shape.chunks > 1 && shape.micro_batches % shape.stages != 0)
    return "the micro-batches (" + std::to_string(shape.micro_batches) + ") must be a multiple of the stages (" +
           std::to_string(shape.stages) + "): they go round the stages in groups of P (Megatron-LM's rule)";
  return "";
}

// GPipe and 1F1B idle alike: (P - 1) / (M + P - 1).
double one_chunk_bubble(const PipelineShape& shape) {
  const double idle = shape.stages - 1;
  return idle / (shape.micro_batches + idle);
}

constexpr ScheduleEntry table[] = {
    // Narayanan et al. (PipeDream-Flush, 2021) as Megatron-LM runs it: stage s does
    // min(P - s - 1, M) warm-up forwards, then alternates one forward and one backward, then
    // drains the remaining backwards, so it never holds more than min(P - s, M) micro-batches.
    {.name = "1f1b",
     .source = "PipeDream-Flush, Narayanan et al. 2021",
     .order = one_f_one_b_order,
     .peak_in_flight = [](const PipelineShape& shape, int stage) {
       return std::min(shape.micro_batches, shape.stages - stage);
     },
     .bubble = one_chunk_bubble,
     .bubble_formula = "(P-1)/(M+P-1)"},
    // Huang et al. (GPipe, 2019): every forward, then every backward; all M micro-batches alive.
    {.name = "gpipe",
     .source = "Huang et al. 2019",
     .order = [](const PipelineShape& shape, int) { return gpipe_order(shape); },
     .peak_in_flight = [](const PipelineShape& shape, int) { return shape.micro_batches; },
     .bubble = one_chunk_bubble,
     .bubble_formula = "(P-1)/(M+P-1)"},
    // Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21): V chunks of layers per stage,
    // which divides the bubble by V (section 2.2).
    {.name = "interleaved",
     .source = "Megatron-LM's interleaved 1F1B, Narayanan et al. SC'21",
     .chunked = true,
     .shape_problem = interleaved_shape_problem,
     .order = interleaved_order,
     .peak_in_flight = interleaved_peak,
     .bubble = [](const PipelineShape& shape) {
       const double idle = shape.stages - 1;
       return idle / (shape.chunks * shape.micro_batches + idle);
     },
     .bubble_formula = "(P-1)/(VM+P-1)"},
    // Zero-bubble H1 (Qi et al., 2023): backward split into B and W, W deferred into the bubble,
    // at 1F1B's activation memory. Its bubble is (P - 1)(T_F + T_B - T_W) against 1F1B's
    // (P - 1)(T_F + T_B + T_W) (section 3.1): (P - 1) / (3M + P - 1) with F = B = W.
    {.name = "zb-h1",
     .source = "zero bubble, Qi et al. 2023",
     .order = zero_bubble_h1_order,
     .peak_in_flight = [](const PipelineShape& shape, int) { return std::min(shape.micro_batches, shape.stages); },
     .bubble = [](const PipelineShape& shape) {
       const double idle = shape.stages - 1;
       return idle / (3 * shape.micro_batches + idle);
     },
     .bubble_formula = "(P-1)/(3M+P-1) with F = B = W"},
    // Zero-bubble V (Qi et al., 2023, section 6): two chunks a stage in a V, backward split into
    // B and W. A chunk is half a stage, so a stage keeps at most 2P chunk-micro-batches in flight,
    // 1F1B's activations; at equal F, B and W only the first forwards' fill is idle, (P - 1)
    // chunk steps: (P - 1) / (6M + P - 1) once M >= 2P - 1, half ZB-H1's.
    {.name = "zb-v",
     .source = "zero bubble V, Qi et al. 2023 (PyTorch's ScheduleZBVZeroBubble order)",
     .placement = ChunkPlacement::v_shape,
     .order = zero_bubble_v_order,
     .peak_in_flight = [](const PipelineShape& shape, int stage) {
       return std::min({2 * shape.stages, 2 * shape.micro_batches, shape.micro_batches + 1 + stage});
     },
     .bubble = [](const PipelineShape& shape) {
       const double idle = shape.stages - 1;
       return idle / (6 * shape.micro_batches + idle);
     },
     .bubble_formula = "(P-1)/(6M+P-1) with F = B = W, M >= 2P-1"},
};

}  // namespace

int one_f_one_b_warmup(int stages, int stage, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches);
}

std::span<const ScheduleEntry> schedule_table() { return table; }

const ScheduleEntry* find_schedule(std::string_view name) {
  for (const ScheduleEntry& entry : table)
    if (entry.name == name) return &entry;
  return nullptr;
}

const ScheduleEntry& schedule_named(std::string_view name) {
  const ScheduleEntry* entry = find_schedule(name);
  if (entry == nullptr) throw std::logic_error("no pipeline schedule named '" + std::string(name) + "'");
  return *entry;
}

std::string schedule_names() {
  std::string names;
  for (const ScheduleEntry& entry : table) names += (names.empty() ? "" : " | ") + std::string(entry.name);
  return names;
}

std::string schedule_shape_problem(const ScheduleEntry& schedule, const PipelineShape& shape) {
  if (shape.stages < 1 || shape.chunks < 1 || shape.micro_batches < 1)
    return "stages, chunks and micro-batches must be at least 1";
  if (shape.placement != schedule.placement)
    return std::string(schedule.name) + (schedule.placement == ChunkPlacement::v_shape ? " places its chunks in a V"
                                                                                         : " places its chunks in a loop");
  if (schedule.placement == ChunkPlacement::v_shape && shape.chunks != 2)
    return std::string(schedule.name) + " holds two chunks a stage";
  if (!schedule.chunked && schedule.placement == ChunkPlacement::looped && shape.chunks != 1)
    return std::string(schedule.name) + " holds one chunk per stage";
  return schedule.shape_problem != nullptr ? schedule.shape_problem(shape) : "";
}

PipelineShape schedule_shape(const ScheduleEntry& schedule, int stages, int virtual_stages, int micro_batches) {
  const int chunks = schedule.chunked ? virtual_stages : schedule.placement == ChunkPlacement::v_shape ? 2 : 1;
  return {.stages = stages, .chunks = chunks, .micro_batches = micro_batches, .placement = schedule.placement};
}

std::vector<Action> stage_schedule(const ScheduleEntry& schedule, const PipelineShape& shape, int stage, bool training) {
  // Evaluating, the forwards alone, each micro-batch through the stage's chunks in turn (which
  // needs no rule on the number of micro-batches: an evaluation's last one may be short).
  std::vector<Action> order;
  if (training) {
    if (const std::string problem = schedule_shape_problem(schedule, shape); !problem.empty())
      throw std::logic_error("pipeline schedule " + std::string(schedule.name) + ": " + problem);
    order = schedule.order(shape, stage);
  } else {
    for (int micro_batch = 0; micro_batch < shape.micro_batches; ++micro_batch)
      for (int chunk = 0; chunk < shape.chunks; ++chunk) order.push_back({ActionKind::forward, micro_batch, chunk});
  }
  // Where a chunk sits in the whole model: its input comes from the chunk before (unless it is
  // the model's first), its output goes to the chunk after (unless it is the last).
  const int last_chunk = shape.stages * shape.chunks - 1;
  const auto global = [&](const Action& action) { return global_chunk(shape, stage, action.chunk); };
  const auto sends_on = [](const Action& action) {
    return action.kind == ActionKind::backward || action.kind == ActionKind::backward_input;
  };
  // A computation waits for data from a neighbour: a forward from the previous chunk, a
  // backward (or its B) from the next.
  const auto post_receive = [&](std::vector<Action>& actions, const Action& computation) {
    if (computation.kind == ActionKind::forward && global(computation) > 0)
      actions.push_back({ActionKind::receive_activations, computation.micro_batch, computation.chunk});
    if (sends_on(computation) && global(computation) < last_chunk)
      actions.push_back({ActionKind::receive_gradients, computation.micro_batch, computation.chunk});
  };
  // Each receive is posted one computation ahead, so its transfer overlaps that computation;
  // but a W frees the output gradients kept for it, so the receive after a W is posted once the
  // W is done: its buffer never sits beside them (a V's stage 0 would otherwise peak one chunk
  // input above 1F1B plus the deferred W's gradients), and the W sends nothing a neighbour waits on.
  std::vector<Action> actions;
  for (std::size_t index = 0; index < order.size(); ++index) {
    const Action& computation = order[index];
    const bool frees_after = computation.kind == ActionKind::backward_weight;
    if (index == 0) post_receive(actions, order[0]);
    if (index + 1 < order.size() && !frees_after) post_receive(actions, order[index + 1]);
    actions.push_back(computation);
    if (index + 1 < order.size() && frees_after) post_receive(actions, order[index + 1]);
    if (computation.kind == ActionKind::forward && global(computation) < last_chunk)
      actions.push_back({ActionKind::send_activations, computation.micro_batch, computation.chunk});
    if (sends_on(computation) && global(computation) > 0)
      actions.push_back({ActionKind::send_gradients, computation.micro_batch, computation.chunk});
  }
  return actions;
}

}  // namespace mlptrain
