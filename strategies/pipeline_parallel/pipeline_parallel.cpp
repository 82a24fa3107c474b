// Pipeline parallelism: the layers split into P contiguous stages of about equal cost (the first
// and last layers have other shapes, so a stage's cost is its multiply-adds per sample, not its
// layer count), one stage per rank of the pipeline group, or into 2P or VP chunks placed in a V or
// a loop over them. The strategy supplies each stage's schedule (an entry of
// schedule/schedule_table.hpp) and moves the tensors across chunk
// boundaries with non-blocking sends and receives on the pipeline group: a micro-batch's output
// activations forward, its input gradients backward. Ranks of a stage that share a
// tensor-parallel group exchange their own slices with the same slices of the next stage, and
// every data-parallel replica runs its own pipeline. The loss, gradient norms and checkpoints are
// the loop's world-wide sums and collective writes, so nothing else here knows about stages.
#include <fmt/format.h>

#include "schedule/schedule_table.hpp"
#include "strategies/pipeline_parallel/pipeline_options.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

std::vector<std::int64_t> layer_costs(const std::vector<LayerSpec>& model) {
  std::vector<std::int64_t> costs;
  for (const LayerSpec& layer : model) costs.push_back(layer_cost(layer));
  return costs;
}

// The stages, their model chunks (V under the interleaved schedule, two in a V under ZB-V, else
// one) and the micro-batches.
PipelineShape pipeline_shape(const Config& config, int stages, int micro_batches) {
  const PipelineOptions& options = config.strategies.get<PipelineOptions>();
  return schedule_shape(options.schedule, stages, options.virtual_stages, micro_batches);
}

class Pipeline final : public Strategy, public StageTransfers {
 public:
  explicit Pipeline(const StrategyContext& context)
      : group_(context.groups.group(GroupKind::pipeline)), stage_(group_.rank()),
        shape_(pipeline_shape(context.config, group_.size(), context.config.data.micro_batches)),
        boundaries_(shape_.stages * shape_.chunks) {}

  Request start_transfer(const TransferEvent& event) override {
    const bool to_next = event.kind == ActionKind::send_activations;
    const bool from_next = event.kind == ActionKind::receive_gradients;
    const bool sends = to_next || event.kind == ActionKind::send_gradients;
    // The neighbouring chunk's stage: round the stages when looped (the last stage's chunk feeds
    // the first stage's next one), in a V back up from the bottom, where a stage passes its
    // first chunk's output to its second itself (a transfer to its own rank).
    const int global = global_chunk(shape_, stage_, event.chunk);
    const int peer = stage_of_chunk(shape_, to_next || from_next ? global + 1 : global - 1);
    // The boundary the tensor crosses (after global chunk `boundary`) and its micro-batch name
    // the message: with several chunks, two stages exchange tensors of several boundaries, each
    // side in its own schedule's order. (The tag wraps within MPI's guaranteed range; messages
    // with one tag between two ranks still match in order.)
    const int boundary = to_next || from_next ? global : global - 1;
    const int tag = (event.micro_batch * boundaries_ + boundary) % 32768;
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
  const PipelineShape shape_;
  const int boundaries_;
};

constexpr Option options[] = {
    strategy_option<PipelineOptions, &PipelineOptions::schedule>("schedule", "pipeline schedule"),
    strategy_option<PipelineOptions, &PipelineOptions::virtual_stages>(
        "virtual-stages", "interleaved: model chunks per pipeline stage (the layers split into pp x V chunks)"),
};

// A layer for every chunk, and a shape the schedule suits (its table entry's rule).
void validate(const Config& config) {
  const PipelineOptions& options = config.strategies.get<PipelineOptions>();
  const ScheduleEntry& schedule = options.schedule;
  const int layers = config.model.layers, stages = config.grid.pp, micro_batches = config.data.micro_batches;
  require(layers >= stages,
          fmt::format("--pp {} needs at least one layer per stage (got --layers {})", stages, layers));
  at_least("virtual-stages", options.virtual_stages, 1);
  const int fixed_chunks = schedule_shape(schedule, stages, 1, micro_batches).chunks;
  require(options.virtual_stages == 1 || schedule.chunked,
          fmt::format("--virtual-stages splits each pipeline stage into model chunks: --schedule {} holds {} a stage",
                      schedule.name, fixed_chunks == 1 ? "one chunk" : fmt::format("{} chunks", fixed_chunks)));
  const PipelineShape shape = schedule_shape(schedule, stages, options.virtual_stages, micro_batches);
  const std::string chunks = schedule.chunked ? fmt::format("--virtual-stages {}", options.virtual_stages)
                                              : fmt::format("--schedule {}'s {} chunks a stage", schedule.name, shape.chunks);
  require(layers >= shape.stages * shape.chunks,
          fmt::format("--pp {} x {} needs at least one layer per chunk (got --layers {})", stages, chunks, layers));
  const std::string problem = schedule_shape_problem(schedule, shape);
  require(problem.empty(), fmt::format("--schedule {}: {}", schedule.name, problem));
}

bool wanted(const Config&, const GridShape& shape) { return shape.pp > 1; }


RankLayers stage_layers(const Config& config, const std::vector<LayerSpec>& model, const GridShape& shape,
                        const GridCoordinates& place) {
  return stage_chunks(layer_costs(model), pipeline_shape(config, shape.pp, config.data.micro_batches), place.pp);
}

std::vector<Action> schedule(const Config& config, const GridShape& shape, const GridCoordinates& place,
                             int micro_batches, bool training) {
  return stage_schedule(config.strategies.get<PipelineOptions>().schedule, pipeline_shape(config, shape.pp, micro_batches),
                        place.pp, training);
}

// The loop predicts the transfers and the activations from the schedule it executes; each stage
// holds its own layers' parameters, gradients and optimizer state.
void predict(const RankLayout&, Prediction& prediction) {
  Prediction::shard(prediction.params);
  Prediction::shard(prediction.grads);
  Prediction::shard(prediction.optimizer);
}

std::string describe(const RankLayout& layout) {
  const PipelineShape shape = pipeline_shape(layout.config, layout.shape.pp, layout.config.data.micro_batches);
  std::string ranges;
  for (const LayerRange& range : balanced_stages(layer_costs(layout.model), shape.stages * shape.chunks))
    ranges += fmt::format("{}{}-{}", ranges.empty() ? "" : ", ", range.first, range.last - 1);
  const ScheduleEntry& schedule = layout.config.strategies.get<PipelineOptions>().schedule;
  const std::string placement = shape.placement == ChunkPlacement::v_shape
                                    ? fmt::format("chunks c and {} - c on stage c", 2 * shape.stages - 1)
                                    : fmt::format("chunk c on stage c mod {}", shape.stages);
  return fmt::format("pipeline of {} stages x {} chunk(s) (layers {}, {}), {} schedule ({}) "
                     "over {} micro-batch(es): ideal bubble {} = {:.3f}",
                     shape.stages, shape.chunks, ranges, placement, schedule.name, schedule.source,
                     shape.micro_batches, schedule.bubble_formula, schedule.bubble(shape));
}


// The schedule and, from its table entry, its theory: what a trace's timeline holds the measured
// bubble to.
void settings(const Config& config, const GridShape& grid, std::vector<RunSetting>& settings) {
  const PipelineOptions& options = config.strategies.get<PipelineOptions>();
  const ScheduleEntry& schedule = options.schedule;
  const PipelineShape shape = schedule_shape(schedule, grid.pp, options.virtual_stages, config.data.micro_batches);
  settings.push_back({.name = "schedule", .value = std::string(schedule.name)});
  settings.push_back({.name = "virtual_stages", .value = std::int64_t{options.virtual_stages}});
  settings.push_back({.name = "chunk_placement",
                      .value = std::string(shape.placement == ChunkPlacement::v_shape ? "v_shape" : "looped")});
  settings.push_back({.name = "theoretical_bubble", .value = schedule.bubble(shape)});
  settings.push_back({.name = "bubble_formula", .value = std::string(schedule.bubble_formula)});
  settings.push_back({.name = "schedule_source", .value = std::string(schedule.source)});
  std::vector<std::vector<std::int64_t>> global_chunks(static_cast<std::size_t>(shape.stages));
  for (int stage = 0; stage < shape.stages; ++stage)
    for (int chunk = 0; chunk < shape.chunks; ++chunk)
      global_chunks[static_cast<std::size_t>(stage)].push_back(global_chunk(shape, stage, chunk));
  settings.push_back({.name = "global_chunks", .value = std::move(global_chunks)});
}

}  // namespace

extern const StrategyRegistration pipeline_registration = register_strategy<Pipeline>({
    .name = "pipeline",
    .options = options,
    .validate = validate,
    .wanted = wanted,
    .layers = stage_layers,
    .schedule = schedule,
    .predict = predict,
    .describe = describe,
    .settings = settings});

}  // namespace mlptrain
