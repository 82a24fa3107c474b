// State runs (see state_runs.hpp).
#include "model/state_runs.hpp"

#include <algorithm>

#include "core/rng.hpp"

namespace mlptrain {

StatePlacement store_placement(const ParameterStore& store, const GridShape& shape,
                               const GridCoordinates& place) {
  StatePlacement placement;
  for (const ParameterTensor& tensor : store.tensors()) {
    const bool owned = ParameterStore::owns(tensor, shape, place);
    for_each_run(tensor.global_shape, tensor.local_start, tensor.local_shape,
                 [&](std::int64_t global_offset, std::int64_t local_offset, std::int64_t count) {
                   const std::size_t at = tensor.offset + static_cast<std::size_t>(local_offset);
                   placement.updated.push_back(
                       {.tensor = &tensor,
                        .offset = global_offset,
                        .count = count,
                        .values = store.values() ? store.values() + at : nullptr,
                        .grads = store.grads() ? store.grads() + at : nullptr,
                        .moment_offset = placement.moment_count,
                        .owned = owned});
                   placement.moment_count += static_cast<std::size_t>(count);
                 });
  }
  placement.held = placement.updated;
  return placement;
}

void initialize_values(const std::vector<StateRun>& held, std::uint64_t seed) {
  for (const StateRun& run : held) {
    const CounterRng rng(seed, run.tensor->path);
    rng.fill_uniform(run.values, static_cast<std::uint64_t>(run.offset),
                     static_cast<std::size_t>(run.count), -run.tensor->init_bound,
                     run.tensor->init_bound);
  }
}

std::vector<const StateRun*> runs_of(const std::vector<StateRun>& runs, int global_index) {
  std::vector<const StateRun*> found;
  for (const StateRun& run : runs)
    if (run.tensor->global_index == global_index) found.push_back(&run);
  std::sort(found.begin(), found.end(),
            [](const StateRun* a, const StateRun* b) { return a->offset < b->offset; });
  return found;
}

}  // namespace mlptrain
