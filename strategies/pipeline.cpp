// Pipeline parallelism: the layers split into P contiguous stages of about equal cost (the first
// and last layers have other shapes, so a stage's cost is its multiply-adds per sample, not its
// layer count), one stage per rank of the pipeline group. The strategy supplies each stage's
// schedule (1F1B or GPipe, strategies/schedule.hpp) and moves the tensors across stage
// boundaries with non-blocking sends and receives on the pipeline group: a micro-batch's output
// activations forward, its input gradients backward. Ranks of a stage that share a
// tensor-parallel group exchange their own slices with the same slices of the next stage, and
// every data-parallel replica runs its own pipeline. The loss, gradient norms and checkpoints are
// the loop's world-wide sums and collective writes, so nothing else here knows about stages.
#include <fmt/format.h>

#include "strategies/strategy.hpp"

namespace mlptrain {

namespace {

PipelineKind pipeline_kind(const Config& config) {
  return config.schedule == "gpipe" ? PipelineKind::gpipe : PipelineKind::one_f_one_b;
}

std::vector<LayerRange> stages_of(const std::vector<LayerSpec>& model, int stages) {
  std::vector<std::int64_t> costs;
  for (const LayerSpec& layer : model) costs.push_back(layer_cost(layer));
  return balanced_stages(costs, stages);
}

class Pipeline final : public Strategy {
 public:
  explicit Pipeline(const StrategyContext& context)
      : config_(context.config), group_(context.groups.group(GroupKind::pipeline)),
        layers_(context.layers), kind_(pipeline_kind(context.config)), stage_(group_.rank()),
        stages_(group_.size()) {}

  std::string_view name() const override { return "pipeline"; }

  std::string note() const override {
    std::string ranges;
    for (const LayerRange& range : stages_of(layers_, stages_))
      ranges += fmt::format("{}{}-{}", ranges.empty() ? "" : ", ", range.first, range.last - 1);
    const int micro_batches = config_.micro_batches;
    return fmt::format("pipeline of {} stages (layers {}), {} schedule over {} micro-batch(es): "
                       "ideal bubble (P-1)/(M+P-1) = {:.3f}",
                       stages_, ranges, config_.schedule, micro_batches,
                       static_cast<double>(stages_ - 1) / (micro_batches + stages_ - 1));
  }

  std::optional<std::vector<Action>> schedule(int micro_batches, bool training) const override {
    return pipeline_schedule(kind_, stages_, stage_, micro_batches, training);
  }

  std::optional<Request> start_transfer(const TransferEvent& event) override {
    const bool to_next = event.kind == ActionKind::send_activations;
    const bool from_next = event.kind == ActionKind::receive_gradients;
    const bool sends = to_next || event.kind == ActionKind::send_gradients;
    const int peer = to_next || from_next ? stage_ + 1 : stage_ - 1;
    // The peer tells activations (from the previous stage) and gradients (from the next) apart;
    // between two ranks, MPI keeps messages in order, and both post them in micro-batch order.
    // The tag is a check on that (it wraps within MPI's guaranteed tag range).
    const int tag = event.micro_batch % 32768;
    Operation operation{.op = sends ? CommOp::send : CommOp::recv,
                        .count = event.floats,
                        .type = DataType::float32,
                        .peer = peer,
                        .tag = tag};
    if (sends) {
      operation.send = event.data;
    } else {
      operation.receive = event.data;
    }
    return group_.start(operation);
  }

  // The loop predicts the transfers and the activations from the schedule it executes.
  void predict(PlacementPrediction& prediction) const override {
    // Each stage holds its own layers' parameters, gradients and optimizer state.
    for (std::size_t state = 0; state < 3; ++state)
      if (prediction.modes[state] == "R") prediction.modes[state] = "S";
  }

 private:
  const Config& config_;
  Communicator& group_;
  const std::vector<LayerSpec>& layers_;
  const PipelineKind kind_;
  const int stage_;
  const int stages_;
};

bool wanted(const Config&, const GridShape& shape) { return shape.pp > 1; }

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<Pipeline>(context);
}

LayerRange stage_layers(const std::vector<LayerSpec>& model, const GridShape& shape,
                        const GridCoordinates& place) {
  return stages_of(model, shape.pp)[static_cast<std::size_t>(place.pp)];
}

}  // namespace

extern const StrategyRegistration pipeline_registration{"pipeline", wanted, create, nullptr,
                                                        stage_layers};

}  // namespace mlptrain
