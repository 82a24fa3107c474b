// Schedule generation (see schedule.hpp).
#include "schedule/schedule.hpp"

#include <algorithm>
#include <numeric>

#include <stdexcept>


namespace mlptrain {

std::string_view action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward: return "forward";
    case ActionKind::backward: return "backward";
    case ActionKind::backward_input: return "backward_input";
    case ActionKind::backward_weight: return "backward_weight";
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

int peak_micro_batches_in_flight(const std::vector<Action>& actions) {
  int alive = 0, peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::forward) peak = std::max(peak, ++alive);
    if (action.kind == ActionKind::backward || action.kind == ActionKind::backward_weight) --alive;
  }
  return peak;
}

std::int64_t peak_activation_bytes(const std::vector<Action>& actions, const std::vector<ActivationProfile>& profiles) {
  std::int64_t alive = 0, peak = 0;
  std::vector<std::pair<int, int>> received;  // (chunk, micro-batch)
  for (const Action& action : actions) {
    const ActivationProfile& profile = profiles.at(static_cast<std::size_t>(action.chunk));
    const std::pair<int, int> key{action.chunk, action.micro_batch};
    const bool was_received = std::find(received.begin(), received.end(), key) != received.end();
    if (action.kind == ActionKind::receive_activations) {
      alive += profile.received;
      received.push_back(key);
    } else if (action.kind == ActionKind::forward) {
      const std::int64_t others = alive - (was_received ? profile.received : 0);
      peak = std::max(peak, others + profile.forward_peak);
      alive = others + profile.kept;
    } else if (action.kind == ActionKind::backward) {
      const std::int64_t others = alive - profile.kept;
      peak = std::max(peak, others + profile.backward_peak);
      alive = others;
    } else if (action.kind == ActionKind::backward_input) {
      alive += profile.kept_for_weights - profile.kept;
    } else if (action.kind == ActionKind::backward_weight) {
      alive -= profile.kept_for_weights;
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

RankLayers stage_chunks(const std::vector<std::int64_t>& layer_costs, const PipelineShape& shape, int stage) {
  const std::vector<LayerRange> ranges = balanced_stages(layer_costs, shape.stages * shape.chunks);
  RankLayers layers;
  for (int chunk = 0; chunk < shape.chunks; ++chunk)
    layers.chunks.push_back(ranges[static_cast<std::size_t>(global_chunk(shape, stage, chunk))]);
  return layers;
}

int global_chunk(const PipelineShape& shape, int stage, int local_chunk) {
  if (shape.placement == ChunkPlacement::v_shape) return local_chunk == 0 ? stage : 2 * shape.stages - 1 - stage;
  return local_chunk * shape.stages + stage;
}

int stage_of_chunk(const PipelineShape& shape, int global) {
  if (shape.placement == ChunkPlacement::v_shape) return global < shape.stages ? global : 2 * shape.stages - 1 - global;
  return global % shape.stages;
}

int RankLayers::count() const {
  int total = 0;
  for (const LayerRange& chunk : chunks) total += chunk.count();
  return total;
}

bool RankLayers::contains(int layer) const { return chunk_of(layer) >= 0; }

int RankLayers::chunk_of(int layer) const {
  for (std::size_t chunk = 0; chunk < chunks.size(); ++chunk)
    if (chunks[chunk].contains(layer)) return static_cast<int>(chunk);
  return -1;
}

int RankLayers::local_index(int layer) const {
  int before = 0;
  for (const LayerRange& chunk : chunks) {
    if (chunk.contains(layer)) return before + layer - chunk.first;
    before += chunk.count();
  }
  return -1;
}

std::vector<int> RankLayers::list() const {
  std::vector<int> layers;
  for (const LayerRange& chunk : chunks)
    for (int layer = chunk.first; layer < chunk.last; ++layer) layers.push_back(layer);
  return layers;
}

}  // namespace mlptrain
