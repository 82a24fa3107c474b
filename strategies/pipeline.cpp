// Pipeline parallelism: the layers split into P contiguous stages of about equal cost (the first
// and last layers have other shapes, so a stage's cost is its multiply-adds per sample, not its
// layer count), one stage per rank of the pipeline group. The strategy supplies each stage's
// schedule (1F1B or GPipe, schedule/schedule.hpp) and moves the tensors across stage
// boundaries with non-blocking sends and receives on the pipeline group: a micro-batch's output
// activations forward, its input gradients backward. Ranks of a stage that share a
// tensor-parallel group exchange their own slices with the same slices of the next stage, and
// every data-parallel replica runs its own pipeline. The loss, gradient norms and checkpoints are
// the loop's world-wide sums and collective writes, so nothing else here knows about stages.
#include <fmt/format.h>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

std::vector<LayerRange> stages_of(const std::vector<LayerSpec>& model, int stages) {
  std::vector<std::int64_t> costs;
  for (const LayerSpec& layer : model) costs.push_back(layer_cost(layer));
  return balanced_stages(costs, stages);
}

class Pipeline final : public Strategy, public StageTransfers {
 public:
  explicit Pipeline(const StrategyContext& context)
      : group_(context.groups.group(GroupKind::pipeline)), stage_(group_.rank()) {}

  Request start_transfer(const TransferEvent& event) override {
    const bool to_next = event.kind == ActionKind::send_activations;
    const bool from_next = event.kind == ActionKind::receive_gradients;
    const bool sends = to_next || event.kind == ActionKind::send_gradients;
    const int peer = to_next || from_next ? stage_ + 1 : stage_ - 1;
    // The peer tells activations (from the previous stage) and gradients (from the next) apart;
    // between two ranks, MPI keeps messages in order, and both post them in micro-batch order.
    // The tag is a check on that (it wraps within MPI's guaranteed tag range).
    const int tag = event.micro_batch % 32768;
    Operation operation{.op = sends ? CommOp::send : CommOp::recv,
                        .count = event.count,
                        .type = event.type,
                        .peer = peer,
                        .tag = tag};
    if (sends) {
      operation.send = event.data;
    } else {
      operation.receive = event.data;
    }
    return group_.start(operation);
  }

 private:
  Communicator& group_;
  const int stage_;
};

bool wanted(const Config&, const GridShape& shape) { return shape.pp > 1; }

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<Pipeline>(context);
}

LayerRange stage_layers(const std::vector<LayerSpec>& model, const GridShape& shape,
                        const GridCoordinates& place) {
  return stages_of(model, shape.pp)[static_cast<std::size_t>(place.pp)];
}

std::vector<Action> stage_schedule(const Config& config, const GridShape& shape, const GridCoordinates& place,
                                   int micro_batches, bool training) {
  return pipeline_schedule(config.schedule, shape.pp, place.pp, micro_batches, training);
}

// The loop predicts the transfers and the activations from the schedule it executes; each stage
// holds its own layers' parameters, gradients and optimizer state.
void predict(const RankLayout&, Prediction& prediction) {
  Prediction::shard(prediction.params);
  Prediction::shard(prediction.grads);
  Prediction::shard(prediction.optimizer);
}

std::string describe(const RankLayout& layout) {
  const int stages = layout.shape.pp, micro_batches = layout.config.micro_batches;
  std::string ranges;
  for (const LayerRange& range : stages_of(layout.model, stages))
    ranges += fmt::format("{}{}-{}", ranges.empty() ? "" : ", ", range.first, range.last - 1);
  return fmt::format("pipeline of {} stages (layers {}), {} schedule over {} micro-batch(es): ideal bubble "
                     "(P-1)/(M+P-1) = {:.3f}",
                     stages, ranges, choice_name(layout.config.schedule), micro_batches,
                     static_cast<double>(stages - 1) / (micro_batches + stages - 1));
}

constexpr Role roles[] = {Role::owns_schedule};

}  // namespace

extern const StrategyRegistration pipeline_registration{.name = "pipeline",
                                                        .roles = roles,
                                                        .wanted = wanted,
                                                        .create = create,
                                                        .layers = stage_layers,
                                                        .schedule = stage_schedule,
                                                        .predict = predict,
                                                        .describe = describe};

}  // namespace mlptrain
