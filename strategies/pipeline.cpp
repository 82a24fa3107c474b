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
  for (const LayerSpec& layer : model) costs.push_back(layer.in_features * layer.out_features + layer.out_features);
  return balanced_stages(costs, stages);
}

class Pipeline final : public Strategy {
 public:
  explicit Pipeline(const StrategyContext& context)
      : config_(context.config), group_(context.groups.group(GroupKind::pipeline)),
        parameters_(context.parameters), layers_(context.layers), kind_(pipeline_kind(context.config)),
        stage_(group_.rank()), stages_(group_.size()), first_layer_(context.first_layer),
        last_layer_(context.last_layer) {}

  std::string_view name() const override { return "pipeline"; }

  std::string note() const override {
    std::string ranges;
    for (const LayerRange& range : stages_of(layers_, stages_))
      ranges += fmt::format("{}{}-{}", ranges.empty() ? "" : ", ", range.first, range.last - 1);
    const int micro_batches = config_.micro_batches;
    return fmt::format("pipeline of {} stages (layers {}), {} schedule over {} micro-batches: "
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
    // Activations and gradients travel in opposite directions between two stages, so a
    // micro-batch's number tells its messages apart (and MPI keeps messages with one tag in order).
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

  void predict(PlacementPrediction& prediction) const override {
    // Per micro-batch: the output activations to the next stage and back their gradients, the
    // input gradients to the previous stage and from it the activations.
    const std::int64_t rows = config_.global_batch / config_.micro_batches / config_.dp;
    const std::int64_t bytes = config_.micro_batches * rows * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t output = bytes * local_width(last_layer_ - 1, 0);
    const std::int64_t input = bytes * local_width(first_layer_, 1);
    if (stage_ + 1 < stages_) {
      prediction.comm(CommOp::send) += output;
      prediction.comm(CommOp::recv) += output;
    }
    if (stage_ > 0) {
      prediction.comm(CommOp::send) += input;
      prediction.comm(CommOp::recv) += input;
    }
  }

 private:
  // A layer's local output (dimension 0 of its weight) or input (dimension 1) width.
  std::int64_t local_width(int layer, std::size_t dimension) const {
    for (const ParameterTensor& tensor : parameters_.tensors())
      if (tensor.layer == layer && tensor.global_shape.size() == 2) return tensor.local_shape[dimension];
    return 0;
  }

  const Config& config_;
  Communicator& group_;
  const ParameterStore& parameters_;
  const std::vector<LayerSpec>& layers_;
  const PipelineKind kind_;
  const int stage_;
  const int stages_;
  const int first_layer_;
  const int last_layer_;
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
