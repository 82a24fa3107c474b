// Data parallelism: every rank of the data-parallel group holds the whole model and a slice of
// each micro-batch, and gradients are summed over the group. The gradient buffer is cut into
// buckets of whole layers; as soon as backward finishes the last micro-batch's gradients of a
// bucket (buckets fill from the last layer backwards), its all-reduce is started without blocking
// and progressed at every later hook, so reduction overlaps the rest of backward. Losses are
// scaled by the global sample count, so the sum over ranks is the gradient of the global mean.
#include <algorithm>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

// Buckets of about this size give overlap without many small messages.
constexpr std::size_t bucket_capacity_bytes = 4u << 20;

struct Bucket {
  int first_layer = 0;  // the bucket is complete once this layer's backward is done
  FlatRange range;
  Request request;
};

class DataParallel final : public Strategy {
 public:
  explicit DataParallel(const StrategyContext& context)
      : group_(context.groups.group(GroupKind::data)), parameters_(context.parameters) {
    // Gradients go where the group reduces fastest (in place in shared memory on one node).
    parameters_.reallocate_grads([&](std::size_t bytes) {
      return group_.allocate_collective_memory(context.allocator, MemoryState::grads, bytes);
    });
    for (int layer = context.last_layer - 1; layer >= context.first_layer; --layer) {
      const FlatRange layer_range = parameters_.unit_range(layer);
      if (buckets_.empty() || buckets_.back().range.count * sizeof(float) >= bucket_capacity_bytes)
        buckets_.push_back({.first_layer = layer, .range = layer_range});
      else {
        Bucket& bucket = buckets_.back();
        bucket.first_layer = layer;
        bucket.range = {layer_range.offset, bucket.range.count + layer_range.count};
      }
    }
  }

  std::string_view name() const override { return "data_parallel"; }

  void before_layer_backward(LayerEvent&) override { progress(); }

  void after_layer_backward(LayerEvent& event) override {
    if (event.last_micro_batch()) {
      for (Bucket& bucket : buckets_) {
        if (bucket.first_layer != event.layer) continue;
        bucket.request =
            group_.all_reduce_async(parameters_.grads() + bucket.range.offset, bucket.range.count);
      }
    }
    progress();
  }

  void synchronize_gradients(const StepEvent&) override {
    for (Bucket& bucket : buckets_) bucket.request.wait();
  }

  void predict(PlacementPrediction& prediction) const override {
    prediction.modes[3] = "S";  // each rank holds the activations of its own samples
    prediction.comm(CommOp::all_reduce) +=
        static_cast<std::int64_t>(parameters_.size() * sizeof(float));
  }

 private:
  // MPI advances non-blocking collectives only inside MPI calls: poll them between layers.
  void progress() {
    for (Bucket& bucket : buckets_) bucket.request.test();
  }

  Communicator& group_;
  ParameterStore& parameters_;
  std::vector<Bucket> buckets_;
};

bool wanted(const Config& config, const GridShape& shape) {
  return shape.dp > 1 && config.zero == 0;
}

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<DataParallel>(context);
}

}  // namespace

extern const StrategyRegistration data_parallel_registration{"data_parallel", wanted, create};

}  // namespace mlptrain
