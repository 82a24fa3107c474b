// State runs (see state_runs.hpp).
#include "model/state_runs.hpp"

#include <algorithm>

#include "core/rng.hpp"

namespace mlptrain {

StatePlacement store_placement(const ParameterStore& store, const GridShape& shape,
                               const GridCoordinates& place) {
  StatePlacement placement;
  for (const ParameterTensor& tensor : store.tensors()) {
    append_local_range(placement.updated, tensor, 0, tensor.count,
                       store.values() ? store.values() + tensor.offset : nullptr,
                       store.grads() ? store.grads() + tensor.offset : nullptr,
                       placement.moment_count, ParameterStore::owns(tensor, shape, place));
    placement.moment_count += tensor.count;
  }
  placement.held = placement.updated;
  return placement;
}

void append_local_range(std::vector<StateRun>& runs, const ParameterTensor& tensor,
                        std::size_t local_offset, std::size_t count, float* values, float* grads,
                        std::size_t moment_offset, bool owned) {
  const auto begin = static_cast<std::int64_t>(local_offset);
  const auto end = begin + static_cast<std::int64_t>(count);
  for_each_run(tensor.global_shape, tensor.local_start, tensor.local_shape,
               [&](std::int64_t global_offset, std::int64_t run_local, std::int64_t run_count) {
                 const std::int64_t first = std::max(begin, run_local);
                 const std::int64_t last = std::min(end, run_local + run_count);
                 if (first >= last) return;
                 const auto skip = static_cast<std::size_t>(first - begin);
                 runs.push_back({.tensor = &tensor,
                                 .offset = global_offset + (first - run_local),
                                 .count = last - first,
                                 .values = values ? values + skip : nullptr,
                                 .grads = grads ? grads + skip : nullptr,
                                 .moment_offset = moment_offset + skip,
                                 .owned = owned});
               });
}

void initialize_values(const std::vector<StateRun>& held, std::uint64_t seed, Allocator& memory) {
  std::vector<float> host;  // where the values are drawn when they live in a device's memory
  for (const StateRun& run : held) {
    const CounterRng rng(seed, run.tensor->path);
    const auto count = static_cast<std::size_t>(run.count);
    const bool direct = memory.device() == Device::cpu;
    if (!direct) host.resize(count);
    float* values = direct ? run.values : host.data();
    rng.fill_uniform(values, static_cast<std::uint64_t>(run.offset), count, -run.tensor->init_bound,
                     run.tensor->init_bound);
    if (!direct) memory.copy_to_device(run.values, values, count * sizeof(float));
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
