// State runs (see state_runs.hpp).
#include "model/state_runs.hpp"

#include <algorithm>
#include <cstddef>

#include "core/half_float.hpp"
#include "core/rng.hpp"

namespace mlptrain {

StatePlacement store_placement(const ParameterStore& store, const GridShape& shape,
                               const GridCoordinates& place) {
  StatePlacement placement{.precision = store.precision()};
  for (const ParameterTensor& tensor : store.tensors()) {
    append_local_range(placement.updated, tensor, 0, tensor.count, store.value_at(tensor.offset),
                       store.grad_at(tensor.offset), placement.moment_count,
                       ParameterStore::copies_of(tensor, shape, place), store.precision());
    placement.moment_count += tensor.count;
  }
  placement.held = placement.updated;
  return placement;
}

void append_local_range(std::vector<StateRun>& runs, const ParameterTensor& tensor,
                        std::size_t local_offset, std::size_t count, void* values, void* grads,
                        std::size_t moment_offset, RunCopies copies, const Precision& precision) {
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
                                 .values = advance(values, skip, precision.param),
                                 .grads = advance(grads, skip, precision.reduce),
                                 .moment_offset = moment_offset + skip,
                                 // fp32 values are their own masters; else the optimizer's
                                 .master = precision.keeps_master() ? nullptr
                                                                    : static_cast<float*>(advance(values, skip, precision.param)),
                                 .copies = copies});
               });
}

void initialize_state(const StatePlacement& placement, std::uint64_t seed, Allocator& memory,
                      Allocator& master_memory) {
  std::vector<float> drawn;                  // a run's values in fp32, as drawn
  std::vector<std::byte> rounded;            // ... and in the param type
  const DataType type = placement.precision.param;
  const auto draw = [&](const StateRun& run) {
    drawn.resize(static_cast<std::size_t>(run.count));
    CounterRng(seed, run.tensor->path)
        .fill_uniform(drawn.data(), static_cast<std::uint64_t>(run.offset), drawn.size(), -run.tensor->init_bound,
                      run.tensor->init_bound);
  };
  for (const StateRun& run : placement.held) {
    draw(run);
    rounded.resize(drawn.size() * size_of(type));
    for (std::size_t i = 0; i < drawn.size(); ++i) store_element(rounded.data(), i, type, drawn[i]);
    memory.copy_host_to_any(run.values, rounded.data(), rounded.size());
  }
  if (!placement.precision.keeps_master()) return;  // the values are the masters
  for (const StateRun& run : placement.updated) {
    draw(run);
    master_memory.copy_host_to_any(run.master, drawn.data(), drawn.size() * sizeof(float));
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
