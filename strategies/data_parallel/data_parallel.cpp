// Data parallelism: every rank of the data-parallel group holds the whole model and a slice of
// each micro-batch, and gradients are summed over the group. The gradient buffer is cut into
// buckets of whole layers; as soon as backward finishes the last micro-batch's gradients of a
// bucket (buckets fill from the last layer backwards), its all-reduce is started without blocking
// (the communication engine runs it, and every later hook tests it), so reduction overlaps the
// rest of backward. Losses are
// scaled by the global sample count, so the sum over ranks is the gradient of the global mean.
// Each tensor's gradients are summed over its replica group: the whole data-parallel group, or for
// experts split over an expert-parallel group, the ranks holding the same experts; a bucket holds
// ranges of one group only. Gradients are reduced in the reduce type, buckets sized in its bytes
// (--bucket-mb, as PyTorch DDP's bucket_cap_mb).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

// Data parallelism's own options.
struct DataParallelOptions {
  double bucket_mb = 4;  // buckets of about this size give overlap without many small messages
};

std::size_t bucket_capacity_bytes(const Config& config) {
  return static_cast<std::size_t>(std::llround(config.strategies.get<DataParallelOptions>().bucket_mb * (1 << 20)));
}

// A bucket as the layout gives it: what it sums over which group, and the layer whose backward
// completes it.
struct BucketRange {
  int first_layer = 0;
  FlatRange range;
  GroupKind group = GroupKind::data;
};

// The buckets of a rank's layers, last layer first (the order backward fills them). Pure: the
// strategy reduces these, and the cost model counts them.
std::vector<BucketRange> gradient_buckets(const std::vector<ParameterTensor>& tensors, int unit_multiple,
                                          const RankLayers& layers, const GridShape& shape,
                                          std::size_t element_bytes, std::size_t capacity_bytes) {
  std::vector<BucketRange> buckets;
  const std::vector<int> held = layers.list();
  for (auto layer_at = held.rbegin(); layer_at != held.rend(); ++layer_at) {
    const int layer = *layer_at;
    const std::vector<ReplicaSegment> segments = replica_segments(tensors, layer, unit_multiple, shape);
    // An MoE layer's gradients are complete at the end of its B (a split backward runs all of it
    // there), maybe before a later layer's W: its bucket holds no later layer's gradients.
    const bool moe = std::any_of(tensors.begin(), tensors.end(),
                                 [layer](const ParameterTensor& tensor) { return tensor.layer == layer && tensor.expert; });
    for (auto segment = segments.rbegin(); segment != segments.rend(); ++segment) {
      if (group_size(shape, segment->group) == 1) continue;  // experts held by one rank: nothing to sum
      BucketRange* bucket =
          buckets.empty() || (moe && buckets.back().first_layer != layer) ? nullptr : &buckets.back();
      if (bucket != nullptr && bucket->group == segment->group &&
          segment->range.offset + segment->range.count == bucket->range.offset &&
          bucket->range.count * element_bytes < capacity_bytes) {
        bucket->first_layer = layer;
        bucket->range = {segment->range.offset, bucket->range.count + segment->range.count};
      } else {
        buckets.push_back({.first_layer = layer, .range = segment->range, .group = segment->group});
      }
    }
  }
  return buckets;
}

struct Bucket {
  BucketRange layout;
  Communicator* group = nullptr;
  Request request;
};

class DataParallel final : public Strategy, public LayerHooks, public ReducesGradients {
 public:
  explicit DataParallel(const StrategyContext& context) : parameters_(context.parameters) {
    // Gradients go where the group reduces fastest (in place in shared memory on one node).
    Communicator& data = context.groups.group(GroupKind::data);
    parameters_.reallocate_grads([&](std::size_t bytes) {
      return data.allocate_collective_memory(context.allocator, MemoryState::grads, bytes);
    });
    for (const BucketRange& range :
         gradient_buckets(parameters_.tensors(), parameters_.unit_multiple(), context.local, context.groups.shape(),
                          parameters_.precision().reduce_bytes(), bucket_capacity_bytes(context.config)))
      buckets_.push_back({.layout = range, .group = &context.groups.group(range.group)});
  }

  void before_layer_backward(BackwardStart&) override { progress(); }

  void after_layer_backward(const BackwardDone& event) override {
    if (event.last_micro_batch() && event.part != BackwardPart::input) {
      for (Bucket& bucket : buckets_) {
        if (bucket.layout.first_layer != event.layer) continue;
        bucket.request = bucket.group->all_reduce_async(parameters_.grad_at(bucket.layout.range.offset),
                                                        bucket.layout.range.count, parameters_.precision().reduce);
      }
    }
    progress();
  }

  void synchronize_gradients(const StepEvent&) override {
    for (Bucket& bucket : buckets_) bucket.request.wait();
  }

 private:
  // Where the communication engine has no thread of its own (or the backend none), a started
  // operation moves only when tested: poll them between layers.
  void progress() {
    for (Bucket& bucket : buckets_) bucket.request.test();
  }

  ParameterStore& parameters_;
  std::vector<Bucket> buckets_;
};

constexpr Option options[] = {
    strategy_option<DataParallelOptions, &DataParallelOptions::bucket_mb>(
        "bucket-mb", "MiB of gradients a data-parallel all-reduce carries at most (whole layers; started as backward fills them)"),
};

void validate(const Config& config) {
  const double bucket_mb = config.strategies.get<DataParallelOptions>().bucket_mb;
  require(std::isfinite(bucket_mb) && bucket_mb > 0, fmt::format("--bucket-mb must be positive (got {})", bucket_mb));
}

bool wanted(const Config&, const GridShape& shape) { return shape.dp > 1; }


void predict(const RankLayout& layout, Prediction& prediction) {
  Prediction::shard(prediction.activations);  // each rank holds the activations of its own samples
  const std::size_t element_bytes = layout.config.precision.types().reduce_bytes();
  for (const BucketRange& bucket :
       gradient_buckets(layout.tensors, layout.plan.unit_multiple, layout.layers, layout.shape, element_bytes,
                        bucket_capacity_bytes(layout.config)))
    prediction.add_comm(bucket.group, CommOp::all_reduce, static_cast<std::int64_t>(bucket.range.count * element_bytes));
}


}  // namespace

extern const StrategyRegistration data_parallel_registration = register_strategy<DataParallel>({
    .name = "data_parallel",
    .options = options,
    .validate = validate,
    .wanted = wanted,
    .predict = predict});

}  // namespace mlptrain
