// State ranges (see state_ranges.hpp).
#include "model/state_ranges.hpp"

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

void append_local_range(std::vector<StateRange>& ranges, const ParameterTensor& tensor,
                        std::size_t local_offset, std::size_t count, void* values, void* grads,
                        std::size_t moment_offset, RangeCopies copies, const Precision& precision) {
  const auto begin = static_cast<std::int64_t>(local_offset);
  const auto end = begin + static_cast<std::int64_t>(count);
  for_each_run(tensor.global_shape, tensor.local_start, tensor.local_shape,
               [&](std::int64_t global_offset, std::int64_t run_local, std::int64_t run_count) {
                 const std::int64_t first = std::max(begin, run_local);
                 const std::int64_t last = std::min(end, run_local + run_count);
                 if (first >= last) return;
                 const auto skip = static_cast<std::size_t>(first - begin);
                 ranges.push_back({.tensor = &tensor,
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
  std::vector<float> drawn;                  // a range's values in fp32, as drawn
  std::vector<std::byte> rounded;            // ... and in the param type
  const DataType type = placement.precision.param;
  const auto draw = [&](const StateRange& range) {
    drawn.resize(static_cast<std::size_t>(range.count));
    CounterRng(seed, range.tensor->path)
        .fill_uniform(drawn.data(), static_cast<std::uint64_t>(range.offset), drawn.size(), -range.tensor->init_bound,
                      range.tensor->init_bound);
  };
  for (const StateRange& range : placement.held) {
    draw(range);
    rounded.resize(drawn.size() * size_of(type));
    for (std::size_t i = 0; i < drawn.size(); ++i) store_element(rounded.data(), i, type, drawn[i]);
    memory.copy_host_to_any(range.values, rounded.data(), rounded.size());
  }
  if (!placement.precision.keeps_master()) return;  // the values are the masters
  for (const StateRange& range : placement.updated) {
    draw(range);
    master_memory.copy_host_to_any(range.master, drawn.data(), drawn.size() * sizeof(float));
  }
}

std::vector<const StateRange*> ranges_of(const std::vector<StateRange>& ranges, int global_index) {
  std::vector<const StateRange*> found;
  for (const StateRange& range : ranges)
    if (range.tensor->global_index == global_index) found.push_back(&range);
  std::sort(found.begin(), found.end(),
            [](const StateRange* a, const StateRange* b) { return a->offset < b->offset; });
  return found;
}

}  // namespace mlptrain
