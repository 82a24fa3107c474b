// ZeRO stages 1-3 on the data-parallel group (Rajbhandari et al., "ZeRO: memory optimizations
// toward training trillion parameter models", 2020), over the units of zero_units.hpp: rank r of
// N owns shard r of every unit: its optimizer state (all stages), its gradients (stages 2 and 3)
// and its parameters (stage 3). A rank updates only what it owns; the loop and the optimizer see
// that through the placement of the state (StateRange), never through this file.
// A stage is a pair of paths over the shared units (zero_shards.hpp):
//   stage 1: gradients reduced once (zero_gradients.hpp), parameters held (zero_parameters.hpp);
//   stage 2: gradients reduced every micro-batch, parameters held;
//   stage 3: gradients reduced every micro-batch, parameters gathered per use.
// The transient unit buffers the collectives work on (two unit gradient buffers in stage 2, two
// gathered units in stage 3) are fixed pools charged as comm_buffers for the whole run, which
// leaves params, grads and optimizer state at exactly the ZeRO figures (16Ψ/N for stage 3). With
// N = 1 nothing is sharded and nothing communicated. Gathers move the param type (each owner's
// shard is its masters rounded by the update), reductions the reduce type.
// An MoE layer's unit has two pieces with different replicas: its router is sharded over the
// data-parallel group like a dense layer, its experts over the ranks that hold the same experts
// (the edp group; with one such rank that piece is the rank's own, and nothing is sent). Every
// collective is one per piece, over the piece's group.
// Hybrid sharding (--zero-shard-size K: PyTorch FSDP's HYBRID_SHARD, the idea of ZeRO++'s hpZ)
// shards over groups of K consecutive data-parallel ranks instead, N = K above, and sums each
// reduced shard across the dp / K replica groups once a step: gathers and per-micro-batch
// reductions stay inside a node, only one all-reduce of the shards a step crosses nodes.
#include <algorithm>
#include <memory>

#include "strategies/registration.hpp"
#include "strategies/zero/zero_gradients.hpp"
#include "strategies/zero/zero_parameters.hpp"
#include "strategies/zero/zero_options.hpp"
#include "strategies/zero/zero_shards.hpp"

namespace mlptrain {

namespace {

class Zero final : public Strategy, public LayerHooks, public StateSharding, public ReducesGradients {
 public:
  explicit Zero(const StrategyContext& context)
      : shards_(context),
        shape_(context.groups.shape()),
        place_(context.groups.place()),
        gradients_(make_gradient_path(shards_, context.config.strategies.get<ZeroOptions>().stage)),
        parameters_(make_parameter_path(shards_, context.config.strategies.get<ZeroOptions>().stage, *gradients_)) {}

  void before_layer_forward(ForwardStart& event) override {
    if (void* values = parameters_->begin_forward(shards_.unit_of(event.layer), event.recomputing))
      event.unit.values = values;
    progress();
  }
  void after_layer_forward(const ForwardDone& event) override { parameters_->end_forward(shards_.unit_of(event.layer)); }
  void before_layer_backward(BackwardStart& event) override;
  void after_layer_backward(const BackwardDone& event) override;
  void synchronize_gradients(const StepEvent&) override { gradients_->finish_step(); }
  void after_optimizer_step(const StepEvent&) override { parameters_->after_update(); }

  StatePlacement state_placement() const override;

 private:
  void progress() {
    gradients_->progress();
    parameters_->progress();
  }

  const ZeroShards shards_;
  const GridShape& shape_;
  const GridCoordinates& place_;
  // The gradient path first: the parameter path refers to it (and, lending it buffers, waits for
  // its reductions on them when destroyed, before the buffers go).
  std::unique_ptr<ZeroGradientPath> gradients_;
  std::unique_ptr<ZeroParameterPath> parameters_;
};

// A split backward's B reads the parameters and writes no gradient; its W writes the gradients
// and reads no parameter (ZeRO-3 lends it a free slot's gradient area, gathering nothing).
void Zero::before_layer_backward(BackwardStart& event) {
  const std::size_t unit = shards_.unit_of(event.layer);
  ZeroParameterPath::BackwardBuffers buffers;
  if (event.part == BackwardPart::weight) {
    buffers.lent_grads = parameters_->lend_grads();
  } else {
    buffers = parameters_->begin_backward(unit);
  }
  if (buffers.values != nullptr) event.unit.values = buffers.values;
  if (event.part == BackwardPart::input) {
    progress();
    return;
  }
  if (void* grads = gradients_->begin_backward(unit, event.micro_batch, buffers.lent_grads)) {
    // This micro-batch's gradients of the unit go to a unit buffer, written, not accumulated.
    event.unit.grads = grads;
    event.unit.accumulate_grads = false;
  }
  progress();
}

void Zero::after_layer_backward(const BackwardDone& event) {
  const std::size_t unit = shards_.unit_of(event.layer);
  if (event.part != BackwardPart::input) gradients_->end_backward(unit, event.last_micro_batch());
  if (event.part != BackwardPart::weight) parameters_->end_backward(unit);
  progress();
}

StatePlacement Zero::state_placement() const {
  const Precision& precision = shards_.precision();
  const ParameterStore& store = shards_.store();
  StatePlacement placement{.precision = precision};
  placement.moment_count = shards_.layout().shard_total;
  for (const ZeroUnit& unit : shards_.units())
    for (const ZeroSegment& piece : unit.segments) {
      const std::size_t begin = shards_.shard_start(piece), end = begin + piece.shard_size;
      for (const ParameterTensor& tensor : store.tensors()) {
        if (tensor.layer != unit.layer) continue;
        const std::size_t first = std::max(begin, tensor.offset);
        const std::size_t last = std::min(end, tensor.offset + tensor.count);
        if (first >= last) continue;
        const std::size_t in_shard = piece.shard_offset + (first - begin);
        // Every element of the shard is this rank's alone within the piece's group; under hybrid
        // sharding the shard has a copy in each replica group, and a tensor replicated over the
        // tensor-parallel group a copy on each of its ranks.
        RangeCopies copies{shards_.replica_index(piece), piece.replicas};
        if (tensor.replicated_over_tensor) copies = copies.within(place_.tp, shape_.tp);
        append_local_range(placement.updated, tensor, first - tensor.offset, last - first,
                           parameters_->shard_values(first, in_shard), gradients_->shard_grads(first, in_shard),
                           in_shard, copies, precision);
      }
    }
  // Held shards only, or every local value (read back on resume).
  placement.held = parameters_->holds_only_shards() ? placement.updated : store_placement(store, {}, {}).held;
  return placement;
}

constexpr Option options[] = {
    strategy_option<ZeroOptions, &ZeroOptions::stage>("zero", "ZeRO stage 0..3 on the data-parallel group"),
    strategy_option<ZeroOptions, &ZeroOptions::shard_size>(
        "zero-shard-size",
        "hybrid sharding: ZeRO's shards span groups of this many consecutive data-parallel ranks (a node), "
        "replicated across the groups (0: the whole data-parallel group)"),
};

// Shard groups must tile the data-parallel group and fall evenly on each expert's ranks.
void validate(const Config& config) {
  const ZeroOptions& zero = config.strategies.get<ZeroOptions>();
  const GridConfig& grid = config.grid;
  require(zero.stage >= 0 && zero.stage <= 3, fmt::format("--zero must be 0, 1, 2 or 3 (got {})", zero.stage));
  at_least("zero-shard-size", zero.shard_size, 0);
  if (zero.shard_size == 0) return;
  require(zero.stage > 0, "--zero-shard-size shards ZeRO's state: it needs --zero 1, 2 or 3");
  require(grid.dp % zero.shard_size == 0,
          fmt::format("--zero-shard-size {} does not divide dp {}", zero.shard_size, grid.dp));
  require(zero.shard_size % grid.ep == 0 || grid.ep % zero.shard_size == 0,
          fmt::format("--zero-shard-size {} is neither a multiple nor a divisor of --ep {}: each expert's "
                      "ranks must fall evenly into the shard groups", zero.shard_size, grid.ep));
}

bool wanted(const Config& config, const GridShape&) { return config.strategies.get<ZeroOptions>().stage > 0; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates&, ParameterPlan& plan) {
  const int stage = config.strategies.get<ZeroOptions>().stage;
  plan.unit_multiple = std::max(plan.unit_multiple, shape.dp);
  plan.hold_grads = plan.hold_grads && stage == 1;
  plan.hold_values = plan.hold_values && stage <= 2;
}


// ZeRO sums the data-parallel group's gradients itself (reduce-scatter, not all-reduce).
constexpr std::string_view replaces[] = {"data_parallel"};

// Shard groups of --zero-shard-size consecutive data-parallel ranks shape the grid's groups.
void shape(const Config& config, GridShape& shape) { shape.zero_shard = config.strategies.get<ZeroOptions>().shard_size; }

void settings(const Config& config, const GridShape&, std::vector<RunSetting>& settings) {
  const ZeroOptions& zero = config.strategies.get<ZeroOptions>();
  settings.push_back({.name = "zero", .value = std::int64_t{zero.stage}, .layout_word = true});
  settings.push_back({.name = "zero_shard_size", .value = std::int64_t{zero.shard_size}});
}

}  // namespace

extern const StrategyRegistration zero_registration = register_strategy<Zero>({
    .name = "zero",
    .replaces = replaces,
    .options = options,
    .validate = validate,
    .wanted = wanted,
    .plan = plan,
    .predict = zero_predict,
    .describe = zero_describe,
    .shape = shape,
    .settings = settings});

}  // namespace mlptrain
