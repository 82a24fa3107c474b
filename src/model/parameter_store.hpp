// Parameters and their gradients live in two flat buffers; each tensor is a range of them and each
// layer's tensors are contiguous (a unit, padded to a multiple the strategies ask for), so
// gradient buckets and shards are ranges and communication uses large messages. Every tensor
// knows its global shape and the box of it this rank holds. A strategy that shards the state may
// ask the store not to hold full values or gradients at all (see ParameterPlan).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/process_grid.hpp"
#include "core/buffer.hpp"
#include "core/precision.hpp"
#include "model/model_spec.hpp"

namespace mlptrain {

struct ParameterTensor {
  std::string path;  // under /model, e.g. "layers/03/weight"; also the init stream's name
  int layer = 0;
  int global_index = 0;  // position among all of the model's tensors
  std::vector<std::int64_t> global_shape;
  std::vector<std::int64_t> local_start;  // this rank's box in the global tensor
  std::vector<std::int64_t> local_shape;
  std::size_t offset = 0;  // into the flat buffers, in elements
  std::size_t count = 0;
  float init_bound = 0;  // W and b uniform in [-bound, bound]
  bool replicated_over_tensor = true;  // same values on every rank of the TP group
  bool replicated_over_data = true;    // same values on every rank of the DP group...
  // ...or, for an MoE layer's experts, on the ranks of the DP group holding the same experts
  // (the expert_data group: the DP group itself unless experts are split over an EP group).
  bool expert = false;

  // The group over whose ranks this tensor's gradients are summed.
  GroupKind replica_group(const GridShape& shape) const {
    return expert && shape.ep > 1 ? GroupKind::expert_data : GroupKind::data;
  }
};

struct FlatRange {
  std::size_t offset = 0;
  std::size_t count = 0;
};

// How the strategies of a run want parameter memory laid out and held.
struct ParameterPlan {
  // Each layer's range, and each piece of it with other replicas (an MoE layer's experts after
  // its router), is padded to a multiple of this many elements.
  int unit_multiple = 1;
  bool hold_values = true;  // the store holds every local parameter value...
  bool hold_grads = true;   // ...and every gradient (else a strategy holds what it needs)
  // Each narrows a tensor to the box this rank holds (and says whether it is still replicated
  // over the tensor-parallel group), in order; none: every tensor whole.
  std::vector<std::function<void(ParameterTensor&)>> splits;
};

// The tensors of layers [first, last) of the model as the plan places them on this rank, each
// layer's range padded to a multiple of `plan.unit_multiple` elements: weight and bias of a Linear
// layer; router/weight [E, hidden], experts/weight [E, hidden, hidden] and experts/bias
// [E, hidden] of an MoE layer. Global indices count the model's tensors in order.
std::vector<ParameterTensor> model_parameter_tensors(const std::vector<LayerSpec>& specs, int first,
                                                     int last, const ParameterPlan& plan = {});
// The same for the layers `layers` (ascending; a rank's model chunks need not be adjacent).
std::vector<ParameterTensor> model_parameter_tensors(const std::vector<LayerSpec>& specs, const std::vector<int>& layers,
                                                     const ParameterPlan& plan = {});

// A layer's unit: its tensors in `tensors` (a store's layout) and the padding after them.
FlatRange unit_range(const std::vector<ParameterTensor>& tensors, int layer, int unit_multiple);

// Elements of a store holding `tensors`: the end of the last unit, padded.
std::size_t store_size(const std::vector<ParameterTensor>& tensors, int unit_multiple);

// The ranks that hold a run alike (the replicas of a tensor or of a shard) and which of them this
// rank is: one of them counts the run in norms, and each writes its own slice of it to checkpoints.
struct RangeCopies {
  int index = 0;
  int count = 1;
  // These copies, each held again by `inner_count` ranks (this rank being `inner_index` of those).
  RangeCopies within(int inner_index, int inner_count) const {
    return {index * inner_count + inner_index, count * inner_count};
  }
};

// The values are the parameters' compute copy, of the precision's param type; the gradients are of
// its reduce type.
class ParameterStore {
 public:
  ParameterStore(std::vector<ParameterTensor> tensors, Allocator& allocator,
                 const ParameterPlan& plan = {}, const Precision& precision = {});

  std::size_t size() const { return size_; }  // elements of the padded layout
  const Precision& precision() const { return precision_; }
  void* values() const { return values_.as<void>(); }  // null when the plan does not hold them
  void* grads() const { return grads_.as<void>(); }
  // The value or gradient at `element` of the flat layout (null where not held).
  void* value_at(std::size_t element) const { return advance(values(), element, precision_.param); }
  void* grad_at(std::size_t element) const { return advance(grads(), element, precision_.reduce); }
  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  // Moves the values or the gradients into memory from `allocate(bytes)`, e.g. memory a
  // communicator works on in place. The old buffer goes first, so the ledger never holds both (its
  // contents are not kept). Views taken before are stale.
  void reallocate_values(const std::function<Buffer(std::size_t bytes)>& allocate);
  void reallocate_grads(const std::function<Buffer(std::size_t bytes)>& allocate);
  const ParameterTensor& tensor(const std::string& path) const;
  int unit_multiple() const { return unit_multiple_; }
  // A layer's tensors and the padding after them.
  FlatRange unit_range(int layer) const { return mlptrain::unit_range(tensors_, layer, unit_multiple_); }

  // The ranks holding this rank's part of a tensor alike (its data-parallel or expert-data
  // replicas, times its tensor-parallel copies where it is replicated there), and which one this is.
  static RangeCopies copies_of(const ParameterTensor& tensor, const GridShape& shape,
                             const GridCoordinates& place);

 private:
  std::vector<ParameterTensor> tensors_;
  int unit_multiple_ = 1;
  std::size_t size_ = 0;
  Precision precision_;
  Buffer values_;
  Buffer grads_;
};

// A layer's unit cut where the replica group of its tensors changes (each piece with the padding
// after it): what one collective over one group can sum.
struct ReplicaSegment {
  FlatRange range;
  GroupKind group = GroupKind::data;
};
std::vector<ReplicaSegment> replica_segments(const std::vector<ParameterTensor>& tensors, int layer,
                                             int unit_multiple, const GridShape& shape);

// Calls visit(global_flat_offset, local_offset, count) for each row-major run of a box, in order
// (none for an empty box).
template <typename Visit>
void for_each_run(const std::vector<std::int64_t>& global_shape,
                  const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& shape,
                  Visit&& visit) {
  for (std::int64_t extent : shape)
    if (extent == 0) return;
  if (global_shape.size() <= 1) {
    if (!global_shape.empty()) visit(start[0], std::int64_t{0}, shape[0]);
    return;
  }
  // Two or three dimensions: the last dimension's runs, row by row.
  const std::int64_t columns = global_shape.back();
  const std::int64_t local_columns = shape.back();
  std::int64_t outer_rows = 1, global_row_start = 0;
  for (std::size_t dim = 0; dim + 1 < global_shape.size(); ++dim) {
    outer_rows *= shape[dim];
    global_row_start = global_row_start * global_shape[dim] + start[dim];
  }
  // A box whole in every dimension but the first is one contiguous run.
  bool contiguous = true;
  for (std::size_t dim = 1; dim < global_shape.size(); ++dim)
    contiguous = contiguous && shape[dim] == global_shape[dim];
  if (contiguous) {
    visit(global_row_start * columns, std::int64_t{0}, outer_rows * columns);
    return;
  }
  std::int64_t local_offset = 0;
  std::vector<std::int64_t> index(global_shape.size() - 1, 0);
  for (std::int64_t row = 0; row < outer_rows; ++row) {
    std::int64_t global_row = 0;
    for (std::size_t dim = 0; dim + 1 < global_shape.size(); ++dim)
      global_row = global_row * global_shape[dim] + start[dim] + index[dim];
    visit(global_row * columns + start.back(), local_offset, local_columns);
    local_offset += local_columns;
    for (std::size_t dim = index.size(); dim-- > 0;) {
      if (++index[dim] < shape[dim]) break;
      index[dim] = 0;
    }
  }
}

}  // namespace mlptrain
