// Schedule generation (see schedule.hpp).
#include "schedule/schedule.hpp"

#include <algorithm>
#include <numeric>

namespace mlptrain {

std::string_view action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::receive_activations: return "receive_activations";
    case ActionKind::send_activations: return "send_activations";
    case ActionKind::receive_gradients: return "receive_gradients";
    case ActionKind::send_gradients: return "send_gradients";
  }
  return "";
}

std::vector<Action> sequential_schedule(int micro_batches) {
  std::vector<Action> actions;
  for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch) {
    actions.push_back({ActionKind::forward, micro_batch});
    actions.push_back({ActionKind::backward, micro_batch});
  }
  return actions;
}

std::vector<Action> forward_only_schedule(int micro_batches) {
  std::vector<Action> actions;
  for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch)
    actions.push_back({ActionKind::forward, micro_batch});
  return actions;
}

int one_f_one_b_warmup(int stages, int stage, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches);
}

namespace {

std::vector<Action> computation_order(PipelineKind kind, int stages, int stage, int micro_batches,
                                      bool training) {
  if (!training) return forward_only_schedule(micro_batches);
  std::vector<Action> order;
  const auto forward = [&](int micro_batch) { order.push_back({ActionKind::forward, micro_batch}); };
  const auto backward = [&](int micro_batch) { order.push_back({ActionKind::backward, micro_batch}); };
  if (kind == PipelineKind::gpipe) {
    for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch) forward(micro_batch);
    for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch) backward(micro_batch);
    return order;
  }
  const int warmup = one_f_one_b_warmup(stages, stage, micro_batches);
  for (int micro_batch = 0; micro_batch < warmup; ++micro_batch) forward(micro_batch);
  for (int steady = 0; steady < micro_batches - warmup; ++steady) {
    forward(warmup + steady);
    backward(steady);
  }
  for (int micro_batch = micro_batches - warmup; micro_batch < micro_batches; ++micro_batch)
    backward(micro_batch);
  return order;
}

}  // namespace

std::vector<Action> pipeline_schedule(PipelineKind kind, int stages, int stage, int micro_batches,
                                      bool training) {
  const bool first = stage == 0, last = stage == stages - 1;
  const std::vector<Action> order = computation_order(kind, stages, stage, micro_batches, training);
  // A computation waits for data from a neighbour: a forward from the previous stage, a backward
  // from the next.
  const auto post_receive = [&](std::vector<Action>& actions, const Action& computation) {
    if (computation.kind == ActionKind::forward && !first)
      actions.push_back({ActionKind::receive_activations, computation.micro_batch});
    if (computation.kind == ActionKind::backward && !last)
      actions.push_back({ActionKind::receive_gradients, computation.micro_batch});
  };
  std::vector<Action> actions;
  for (std::size_t index = 0; index < order.size(); ++index) {
    if (index == 0) post_receive(actions, order[0]);
    if (index + 1 < order.size()) post_receive(actions, order[index + 1]);
    const Action& computation = order[index];
    actions.push_back(computation);
    if (computation.kind == ActionKind::forward && !last)
      actions.push_back({ActionKind::send_activations, computation.micro_batch});
    if (computation.kind == ActionKind::backward && !first)
      actions.push_back({ActionKind::send_gradients, computation.micro_batch});
  }
  return actions;
}

int peak_micro_batches_in_flight(const std::vector<Action>& actions) {
  int alive = 0, peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::forward) peak = std::max(peak, ++alive);
    if (action.kind == ActionKind::backward) --alive;
  }
  return peak;
}

std::int64_t peak_activation_bytes(const std::vector<Action>& actions, const ActivationProfile& profile) {
  std::int64_t alive = 0, peak = 0;
  std::vector<int> received;
  for (const Action& action : actions) {
    const bool was_received = std::find(received.begin(), received.end(), action.micro_batch) != received.end();
    if (action.kind == ActionKind::receive_activations) {
      alive += profile.received;
      received.push_back(action.micro_batch);
    } else if (action.kind == ActionKind::forward) {
      const std::int64_t others = alive - (was_received ? profile.received : 0);
      peak = std::max(peak, others + profile.forward_peak);
      alive = others + profile.kept;
    } else if (action.kind == ActionKind::backward) {
      const std::int64_t others = alive - profile.kept;
      peak = std::max(peak, others + profile.backward_peak);
      alive = others;
    }
    peak = std::max(peak, alive);
  }
  return peak;
}

std::vector<LayerRange> balanced_stages(const std::vector<std::int64_t>& layer_costs, int stages) {
  const int layers = static_cast<int>(layer_costs.size());
  // The smallest bound on a stage's cost under which cutting greedily needs at most `stages`.
  const auto stages_needed = [&](std::int64_t bound) {
    int count = 1;
    std::int64_t sum = 0;
    for (std::int64_t cost : layer_costs) {
      if (sum + cost > bound) {
        ++count;
        sum = 0;
      }
      sum += cost;
    }
    return count;
  };
  std::int64_t low = *std::max_element(layer_costs.begin(), layer_costs.end());
  std::int64_t high = std::accumulate(layer_costs.begin(), layer_costs.end(), std::int64_t{0});
  while (low < high) {
    const std::int64_t middle = low + (high - low) / 2;
    if (stages_needed(middle) <= stages) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  // Cut greedily under that bound, leaving at least one layer for every later stage.
  std::vector<LayerRange> ranges;
  int first = 0;
  std::int64_t sum = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const int later_stages = stages - static_cast<int>(ranges.size()) - 1;
    if (layer > first && (sum + layer_costs[layer] > low || layers - layer == later_stages)) {
      ranges.push_back({first, layer});
      first = layer;
      sum = 0;
    }
    sum += layer_costs[layer];
  }
  ranges.push_back({first, layers});
  return ranges;
}

}  // namespace mlptrain
