// Where a rank's share of the training state lives, as state ranges: row-major ranges of one tensor's
// elements (flat indices into the whole tensor) with pointers to their values (the compute copy,
// of the param type), gradients (of the reduce type), fp32 master weights (the values themselves
// in fp32) and AdamW moments. A replicated layout has one range per row range of every tensor; a
// sharded one has the pieces of its shards. Each range knows its copies (the ranks holding it
// alike): norms count one copy, checkpoints write a slice from each. The optimizer updates ranges
// and initialization fills held ranges, so none of them needs to know the layout.
#pragma once

#include <cstdint>
#include <vector>

#include "core/process_grid.hpp"
#include "model/parameter_store.hpp"

namespace mlptrain {

struct StateRange {
  const ParameterTensor* tensor = nullptr;  // its path, global shape and init bound
  std::int64_t offset = 0;                  // first element, flat row-major in the whole tensor
  std::int64_t count = 0;
  void* values = nullptr;
  void* grads = nullptr;
  std::size_t moment_offset = 0;  // where its master and moments sit in the optimizer's buffers
  float* master = nullptr;        // the values themselves (fp32), or set by the optimizer
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  RangeCopies copies;
};

// Whether this rank is the copy that counts the range in norms: copies are spread by tensor, so
// the work is balanced.
inline bool counts_in_norms(const StateRange& range) {
  return range.copies.index == range.tensor->global_index % range.copies.count;
}

// A rank's state: the ranges it updates (gradients and moments included), the ranges of values it
// holds for computing (equal to `updated` unless parameters are replicated beyond the shard), and
// the length of the moment buffers (a sharded layout keeps its padding there too, so that every
// rank holds the same amount).
struct StatePlacement {
  std::vector<StateRange> updated;
  std::vector<StateRange> held;
  std::size_t moment_count = 0;
  Precision precision;  // the values' and the gradients' types
};

// The ranges of a store that holds every local value and gradient: every rank updates what it
// holds, as one of the tensor's copies (ParameterStore::copies_of).
StatePlacement store_placement(const ParameterStore& store, const GridShape& shape,
                               const GridCoordinates& place);

// Appends the ranges of the local elements [local_offset, local_offset + count) of `tensor` (flat
// in its local box): one per row piece of the box they cross, with global offsets. `values`,
// `grads` (of `precision`'s types) and the moment offset belong to the first of those elements and
// advance with them.
void append_local_range(std::vector<StateRange>& ranges, const ParameterTensor& tensor,
                        std::size_t local_offset, std::size_t count, void* values, void* grads,
                        std::size_t moment_offset, RangeCopies copies, const Precision& precision);

// Every held value and every master weight from the counter RNG keyed by (seed, tensor path,
// global element index), so any placement starts from the same model: the masters as drawn, the
// values rounded to the param type. `memory` reaches the values; `master_memory` the masters.
void initialize_state(const StatePlacement& placement, std::uint64_t seed, Allocator& memory,
                      Allocator& master_memory);

// The ranges among `ranges` of the tensor with this global index, in row-major order.
std::vector<const StateRange*> ranges_of(const std::vector<StateRange>& ranges, int global_index);

}  // namespace mlptrain
