// The training loop (see trainer.hpp).
#include "train/trainer.hpp"

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fmt/format.h>
#include <memory>
#include <numeric>
#include <optional>

#include "comm/consensus.hpp"
#include "comm/process_groups.hpp"
#include "core/timer.hpp"
#include "data/dataset.hpp"
#include "data/sample_order.hpp"
#include "io/checkpoint.hpp"
#include "train/compute_device.hpp"
#include "train/model_runner.hpp"
#include "train/optimizer.hpp"
#include "train/options.hpp"
#include "train/report.hpp"
#include "train/sample_feed.hpp"
#include "train/schedule_executor.hpp"
#include "train/trace_file.hpp"
#include "train/watchdog.hpp"

namespace mlptrain {

namespace {

class Trainer {
 public:
  Trainer(const Config& config, MPI_Comm world, const CommSettings& comm);
  void predict_only();
  void train();

 private:
  // Reads samples into what the local layers need of them (inputs, targets or labels). A read
  // that fails on this rank alone must not leave the others waiting in the step's collectives:
  // the failure is noted, the step goes on, and its world sum carries the news (see
  // stop_on_read_problem), so every rank stops with the same error.
  void read_samples(Split split, const std::vector<std::int64_t>& indices,
                    MicroBatchActivations& activations) {
    feed_->read(split, indices, {&activations.input, &activations.targets, &activations.labels});
  }
  // This rank's samples of a training micro-batch.
  std::vector<std::int64_t> train_samples(std::int64_t step, int micro_batch) const {
    return order_->samples(batch_.first_position(step, micro_batch, groups_->place().dp),
                           batch_.local_size());
  }
  bool read_problem() const { return feed_->problem().has_value(); }
  void stop_on_read_problem(double ranks_with_problems);
  // A non-finite loss or gradient norm (world sums): stops every rank unless --on-nan skip.
  void stop_unless_skipping(std::int64_t step, double loss_sum, double square_sum) const;
  // Whether this rank's loss sums count in the world's totals: the loss is computed where the
  // last layer is, and the ranks of a tensor-parallel group all hold the same one.
  bool counts_loss() const { return runner_->computes_loss() && groups_->place().tp == 0; }
  CheckpointScope checkpoint_scope();
  StepRecord train_step(std::int64_t step);
  void evaluate(StepRecord& record);
  void save(std::int64_t step);
  void note_peaks();
  void write_trace_file();
  // Sums values over the world (each counted where owned), skipped in one process.
  void world_sum(double* values, std::size_t count);
  // The step's world sum of its four totals. A test-only environment switch,
  // MLPTRAIN_TEST_SKIP_STEP_SUM=RANK:STEP, makes one rank skip it at one step (1-based): the
  // mismatch the watchdog must report.
  void step_sum(std::int64_t step, std::vector<double>& totals);
  // Appends the step's MoE routing figures to its world sums: the aux loss, dropped assignments
  // and each MoE layer's expert loads, counted once per stage (they are global already).
  void append_moe_totals(std::vector<double>& totals, const MoeStatistics& statistics) const;
  void read_moe_totals(const std::vector<double>& totals, StepRecord& record) const;
  PlacementPrediction predict() const;
  std::string describe_run() const;
  TrainingState state(std::int64_t step) const {
    return {placement_.updated, placement_.held, step, batch_.step_position(step)};
  }
  // Runs `allocate` on every rank; running out of memory anywhere is one clear error everywhere.
  template <typename Allocate>
  void allocate_or_explain(Allocate&& allocate);

  const Config& config_;
  MPI_Comm mpi_world_;
  MemoryLedger memory_;
  MemoryLedger host_memory_;  // what --offload keeps in host memory
  CommLedger comm_ledger_;
  // Before everything that may still complete communication while being destroyed.
  std::unique_ptr<TraceRecorder> trace_;
  ComputeDevice device_;
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<Dataset> dataset_;
  LossKind loss_kind_ = LossKind::mse;
  std::vector<LayerSpec> specs_;
  std::vector<int> moe_layers_;  // the model's MoE layers, in order
  std::unique_ptr<ParameterStore> parameters_;
  std::unique_ptr<StrategyStack> strategies_;
  StatePlacement placement_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<SampleOrder> order_;
  std::unique_ptr<SampleFeed> feed_;
  std::unique_ptr<Reporter> reporter_;
  double trace_origin_ms_ = 0;
  std::unique_ptr<ScheduleExecutor> executor_;
  BatchLayout batch_;
  std::vector<Action> schedule_;
  MemoryByState run_peak_{};
  std::int64_t skip_step_sum_at_ = -1;
  int first_layer_ = 0;
  int last_layer_ = 0;
  bool values_read_after_step_ = false;  // a strategy reads the updated values at once
};

Trainer::Trainer(const Config& config, MPI_Comm world_comm, const CommSettings& comm)
    : config_(config), mpi_world_(world_comm) {
  int world_size = 1;
  MPI_Comm_size(mpi_world_, &world_size);
  const GridShape shape{.world = world_size, .tp = config.tp, .dp = config.dp, .pp = config.pp,
                        .ep = config.ep};
  // The device first (its staging carries the groups' messages); a problem opening it is
  // agreed on once the groups exist.
  std::exception_ptr device_problem;
  try {
    device_ = open_compute_device(config, world_comm, memory_, host_memory_);
  } catch (const Error&) {
    device_problem = std::current_exception();
  }
  groups_ = std::make_unique<ProcessGroups>(
      mpi_world_, shape, communicator_factory(config, device_, comm_ledger_, comm.shared_memory));
  Communicator& world = groups_->world();
  const bool rank_zero = world.rank() == 0;
  agree_or_throw(world, [&] {
    if (device_problem) std::rethrow_exception(device_problem);
  });
  Allocator& allocator = *device_.memory;
  Kernels& kernels = *device_.kernels;

  agree_or_throw(world, [&] {
    dataset_ = open_dataset({.name = config.dataset,
                             .path = config.data_path,
                             .input_dim = config.input_dim,
                             .output_dim = config.output_dim});
    if (config.eval_every > 0 && dataset_->info().test_size == 0)
      throw UsageError("--eval-every needs a held-out split, and '" + config.data_path +
                       "' has no /x_test and /y_test");
  });
  const DatasetInfo& data = dataset_->info();
  loss_kind_ = data.kind == TargetKind::classification ? LossKind::cross_entropy : LossKind::mse;
  specs_ = model_layer_specs(config.layers, data.input_dim, config.hidden, data.output_dim,
                             config.moe_every, config.experts, config.top_k);
  for (const LayerSpec& spec : specs_)
    if (spec.moe()) moe_layers_.push_back(spec.index);
  const LayerRange layers = StrategyStack::layers(config, specs_, shape, groups_->place());
  first_layer_ = layers.first;
  last_layer_ = layers.last;

  const ParameterPlan plan = StrategyStack::plan(config, shape, groups_->place());
  allocate_or_explain([&] {
    parameters_ = std::make_unique<ParameterStore>(
        model_parameter_tensors(specs_, first_layer_, last_layer_, plan), allocator, plan);
  });
  const StrategyContext context{.config = config,
                                .groups = *groups_,
                                .kernels = kernels,
                                .allocator = allocator,
                                .parameters = *parameters_,
                                .layers = specs_,
                                .first_layer = first_layer_,
                                .last_layer = last_layer_};
  allocate_or_explain([&] { strategies_ = std::make_unique<StrategyStack>(context); });
  // Every layout starts from the same model: values are a function of (seed, tensor, index).
  placement_ = strategies_->state_placement().value_or(
      store_placement(*parameters_, groups_->shape(), groups_->place()));
  initialize_values(placement_.held, static_cast<std::uint64_t>(config.seed), allocator);
  HostSide* offload = device_.offload ? &*device_.offload : nullptr;
  allocate_or_explain(
      [&] { optimizer_ = std::make_unique<AdamW>(config, allocator, placement_, offload); });
  // The runner's layer views point into the parameter store: taken only now, since strategies
  // may move parameter memory (data parallel places gradients where its group reduces them).
  runner_ = std::make_unique<ModelRunner>(
      kernels, allocator, *parameters_, specs_, first_layer_, last_layer_, *strategies_,
      MoeSettings{.capacity_factor = config.capacity_factor, .aux_loss_coef = config.aux_loss_coef},
      config.recompute);
  // An offloaded update runs into the next forward, which waits for each layer's values; a
  // strategy that shards the state reads them all right after the step (it gathers them).
  if (offload != nullptr)
    runner_->set_forward_gate([this](int layer) { optimizer_->wait_for_layer(layer); });
  values_read_after_step_ = strategies_->state_placement().has_value();
  order_ = std::make_unique<SampleOrder>(data.train_size, config.shuffle,
                                         static_cast<std::uint64_t>(config.seed));
  const bool loss_here = runner_->computes_loss();
  feed_ = std::make_unique<SampleFeed>(
      *dataset_, allocator,
      SampleParts{.inputs = runner_->reads_inputs(),
                  .targets = loss_here && loss_kind_ == LossKind::mse,
                  .labels = loss_here && loss_kind_ == LossKind::cross_entropy});
  batch_ = {.global_batch = config.global_batch,
            .micro_batches = config.micro_batches,
            .data_parallel = config.dp};
  schedule_ = strategies_->schedule(config.micro_batches, true);
  agree_or_throw(world, [&] {
    if (!config.checkpoint_dir.empty() && rank_zero && !config.predict)
      prepare_checkpoint_directory(config.checkpoint_dir);
    if (!config.trace_path.empty() && rank_zero && !config.predict)
      check_trace_path(config.trace_path);
    reporter_ = std::make_unique<Reporter>(rank_zero, config.predict ? "" : config.metrics_path,
                                           config.log_every, config.steps);
  });
  if (!config.trace_path.empty() && !config.predict) {
    trace_ = std::make_unique<TraceRecorder>();
    comm_ledger_.set_trace(trace_.get());
    world.barrier();  // the ranks' common time origin
    trace_origin_ms_ = now_ms();
  }
  executor_ = std::make_unique<ScheduleExecutor>(*runner_, *strategies_, allocator, trace_.get());
  if (const char* skip = std::getenv("MLPTRAIN_TEST_SKIP_STEP_SUM")) {
    int skip_rank = -1;
    long long skip_step = -1;
    if (std::sscanf(skip, "%d:%lld", &skip_rank, &skip_step) == 2 && skip_rank == world.rank())
      skip_step_sum_at_ = skip_step;
  }
  note_peaks();
}

template <typename Allocate>
void Trainer::allocate_or_explain(Allocate&& allocate) {
  agree_or_throw(groups_->world(), [&] {
    try {
      allocate();
    } catch (const std::bad_alloc&) {
      const std::int64_t count = parameter_count(specs_);
      throw RuntimeFailure(fmt::format(
          "out of memory: the model's {} parameters need up to {:.1f} GiB per rank for values, "
          "gradients and AdamW state (--hidden, --layers, --zero)",
          count, 16.0 * static_cast<double>(count) / (1 << 30)));
    }
  });
}

std::string Trainer::describe_run() const {
  const GridShape& shape = groups_->shape();
  std::string widths = std::to_string(specs_.front().in_features);
  for (const LayerSpec& spec : specs_) widths += "->" + std::to_string(spec.out_features);
  std::string strategies;
  for (std::string_view name : strategies_->names()) strategies += " " + std::string(name);
  std::string text = fmt::format(
      "mlptrain: {} rank(s), dp={} tp={} pp={} ep={} zero={}, strategies:{}\n"
      "model: {} layers {} ({} parameters), {} data ({} train samples), global batch {} in {} "
      "micro-batch(es), {} steps\ndevice: {}, communication: {}",
      shape.world, shape.dp, shape.tp, shape.pp, shape.ep, config_.zero,
      strategies.empty() ? " none" : strategies, specs_.size(), widths, parameter_count(specs_),
      dataset_->info().name, dataset_->info().train_size, config_.global_batch,
      config_.micro_batches, config_.steps, device_.description,
      config_.comm == "nccl" ? "NCCL, device to device"
      : device_.staging      ? "MPI, staged through host memory"
                             : "MPI");
  if (!moe_layers_.empty()) {
    std::string layers;
    for (int layer : moe_layers_) layers += (layers.empty() ? "" : ", ") + std::to_string(layer);
    text += fmt::format("\nMoE layer(s) {}: {} experts, top-{}, {}, aux loss coefficient {}", layers,
                        config_.experts, config_.top_k,
                        config_.capacity_factor > 0
                            ? fmt::format("capacity factor {}", config_.capacity_factor)
                            : std::string("dropless"),
                        config_.aux_loss_coef);
  }
  if (config_.recompute)
    text += fmt::format("\nrecompute: the local layers form segments of {}; forward keeps each "
                        "segment's input and backward recomputes the rest",
                        runner_->segment_length());
  if (device_.offload)
    text += fmt::format("\noffload: AdamW's moments and update in host memory, {} piece(s) a step, {}",
                        optimizer_->offloaded_pieces(),
                        values_read_after_step_ ? "done within the step (the sharded state is gathered "
                                                  "right after it)"
                                                : "each sent back while the next forward runs");
  for (const std::string& note : strategies_->notes()) text += "\n" + note;
  return text;
}

PlacementPrediction Trainer::predict() const {
  PlacementPrediction prediction;
  // What the store holds, the moments of what this rank updates, the activations of the
  // micro-batches the schedule keeps alive at once; strategies add what they hold themselves.
  const auto store_bytes = static_cast<std::int64_t>(parameters_->size() * sizeof(float));
  const std::int64_t rows = batch_.local_size();
  prediction.bytes = {parameters_->values() ? store_bytes : 0,
                      parameters_->grads() ? store_bytes : 0,
                      static_cast<std::int64_t>(8 * placement_.moment_count),
                      peak_activation_bytes(schedule_, runner_->activation_profile(rows, loss_kind_))};
  // The step's world sum: loss, correct predictions, squared gradient norm, read failures, and
  // with MoE layers the aux loss, the dropped count and every expert's load.
  const std::size_t moe_totals = moe_layers_.empty() ? 0 : 2 + moe_layers_.size() * config_.experts;
  if (groups_->shape().world > 1)
    prediction.comm(CommOp::all_reduce) += static_cast<std::int64_t>((4 + moe_totals) * sizeof(double));
  // The schedule's transfers across stage boundaries.
  const std::int64_t input_bytes = rows * runner_->input_width() * 4;
  const std::int64_t output_bytes = rows * runner_->output_width() * 4;
  for (const Action& action : schedule_) {
    if (action.kind == ActionKind::send_activations) prediction.comm(CommOp::send) += output_bytes;
    if (action.kind == ActionKind::send_gradients) prediction.comm(CommOp::send) += input_bytes;
    if (action.kind == ActionKind::receive_activations) prediction.comm(CommOp::recv) += input_bytes;
    if (action.kind == ActionKind::receive_gradients) prediction.comm(CommOp::recv) += output_bytes;
  }
  strategies_->predict(prediction);
  if (config_.recompute) prediction.modes[3] = "M";
  if (device_.offload) prediction.modes[2] = "Off";  // the same bytes, in host memory
  return prediction;
}

void Trainer::predict_only() {
  reporter_->line(describe_run());
  reporter_->line("predicted memory of rank 0 and communication per step:\n" +
                  placement_table(predict(), nullptr));
}

void Trainer::note_peaks() {
  for (int state = 0; state < memory_state_count; ++state)
    run_peak_[state] = std::max(run_peak_[state], memory_.peak()[state]);
}

void Trainer::world_sum(double* values, std::size_t count) {
  if (groups_->shape().world > 1) groups_->world().all_reduce(values, count);
}

void Trainer::step_sum(std::int64_t step, std::vector<double>& totals) {
  if (step + 1 != skip_step_sum_at_) world_sum(totals.data(), totals.size());
}

void Trainer::append_moe_totals(std::vector<double>& totals, const MoeStatistics& statistics) const {
  if (moe_layers_.empty()) return;
  const bool counts = groups_->place().dp == 0 && groups_->place().tp == 0;
  totals.push_back(counts ? statistics.aux_loss : 0.0);
  totals.push_back(counts ? statistics.dropped : 0.0);
  for (int layer : moe_layers_) {
    const auto found = statistics.expert_load.find(layer);
    for (int expert = 0; expert < config_.experts; ++expert)
      totals.push_back(counts && found != statistics.expert_load.end() ? found->second[expert] : 0.0);
  }
}

void Trainer::read_moe_totals(const std::vector<double>& totals, StepRecord& record) const {
  if (moe_layers_.empty()) return;
  record.aux_loss = totals[4] / config_.micro_batches;
  record.dropped_tokens = std::llround(totals[5]);
  auto load = totals.begin() + 6;
  for (std::size_t layer = 0; layer < moe_layers_.size(); ++layer) {
    std::vector<std::int64_t>& experts = record.expert_load.emplace_back();
    for (int expert = 0; expert < config_.experts; ++expert) experts.push_back(std::llround(*load++));
  }
}

void Trainer::stop_unless_skipping(std::int64_t step, double loss_sum, double square_sum) const {
  if (config_.on_nan == "skip") return;
  throw AgreedError(ExitCode::runtime_failure,
                    fmt::format("step {}: the loss is {} and the gradient norm {}; stopping before "
                                "this state reaches a checkpoint (lower --lr, clip with --grad-clip, "
                                "or skip such steps with --on-nan skip)",
                                step + 1, std::isfinite(loss_sum) ? "finite" : "not finite",
                                std::isfinite(square_sum) ? "finite" : "not finite"));
}

void Trainer::stop_on_read_problem(double ranks_with_problems) {
  if (ranks_with_problems == 0) return;
  const auto message = first_problem(groups_->world(), feed_->problem());
  throw AgreedError(ExitCode::runtime_failure, message.value_or("reading the data failed"));
}

StepRecord Trainer::train_step(std::int64_t step) {
  const double start_ms = now_ms();
  comm_ledger_.begin_step();
  memory_.reset_peaks();
  if (trace_) trace_->set_step(step);
  const StepEvent event{.step = step};
  strategies_->before_step(event);

  const LossTotals local = executor_->run(
      schedule_,
      {.training = true,
       .micro_batches = config_.micro_batches,
       .loss_kind = loss_kind_,
       .loss_samples = config_.global_batch,
       .rows = [&](int) { return batch_.local_size(); },
       .read = [&](int micro_batch, MicroBatchActivations& activations) {
         read_samples(Split::train, train_samples(step, micro_batch), activations);
         // The next micro-batch's samples, read while the device computes this one.
         const bool last = micro_batch + 1 == config_.micro_batches;
         if (feed_->reads_ahead() && (!last || step + 1 < config_.steps))
           feed_->read_ahead(Split::train, train_samples(last ? step + 1 : step, last ? 0 : micro_batch + 1));
       }});
  const double synchronize_start_ms = now_ms();
  strategies_->synchronize_gradients(event);
  record_span(trace_.get(), "synchronize_gradients", synchronize_start_ms, now_ms());
  const double optimizer_start_ms = now_ms();

  // The step's world sums: loss, correct predictions, squared gradient norm, read failures, and
  // what MoE layers report.
  std::vector<double> totals = {counts_loss() ? local.loss_sum : 0.0,
                                counts_loss() ? local.correct : 0.0, 0.0, read_problem() ? 1.0 : 0.0};
  const MoeStatistics moe = runner_->take_moe_statistics();
  append_moe_totals(totals, moe);
  const double learning_rate = scheduled_learning_rate(config_, step);
  // Every rank sees the same world sums, so every rank takes the same decision.
  const auto finite = [&] { return std::isfinite(totals[0]) && std::isfinite(totals[2]); };
  bool skipped = false;
  if (config_.grad_clip > 0 || config_.on_nan == "skip") {
    totals[2] = AdamW::owned_square_sum(*device_.kernels, placement_.updated);
    step_sum(step, totals);
    stop_on_read_problem(totals[3]);
    skipped = !finite();
    if (skipped) {
      stop_unless_skipping(step, totals[0], totals[2]);
    } else {
      const double coefficient = clip_coefficient(config_.grad_clip, std::sqrt(totals[2]));
      if (coefficient < 1.0)
        AdamW::scale_grads(*device_.kernels, placement_.updated, static_cast<float>(coefficient));
      optimizer_->update(*device_.kernels, placement_.updated, learning_rate, step + 1);
    }
  } else {
    // Without clipping the norm comes free from the update's own pass over the gradients. A
    // non-finite one then stops the run after the update, which never reaches a checkpoint.
    totals[2] = optimizer_->update(*device_.kernels, placement_.updated, learning_rate, step + 1);
    step_sum(step, totals);
    stop_on_read_problem(totals[3]);
    if (!finite()) stop_unless_skipping(step, totals[0], totals[2]);
  }
  if (values_read_after_step_) optimizer_->finish_update();
  strategies_->after_optimizer_step(event);
  record_span(trace_.get(), "optimizer", optimizer_start_ms, now_ms());

  StepRecord record;
  record.step = step + 1;
  record.skipped = skipped;
  record.loss = totals[0] / loss_normalizer(loss_kind_, config_.global_batch, specs_.back().out_features);
  record.lr = learning_rate;
  record.grad_norm = std::sqrt(totals[2]);
  read_moe_totals(totals, record);
  record.routed_all_to_all_bytes = moe.all_to_all_bytes;
  record.step_ms = now_ms() - start_ms;
  record.samples_per_s = static_cast<double>(config_.global_batch) / (record.step_ms / 1000.0);
  record.comm = comm_ledger_.step();
  record.memory = memory_.current();
  record.peak_memory = memory_.peak();
  note_peaks();
  return record;
}

void Trainer::evaluate(StepRecord& record) {
  const double start_ms = now_ms();
  const std::int64_t test_size = dataset_->info().test_size;
  const std::int64_t chunk = batch_.micro_batch_size();
  const int dp = groups_->shape().dp, dp_rank = groups_->place().dp;
  // The test split in micro-batch sized chunks, each spread over the data-parallel ranks.
  const auto slice = [&](int index) {
    const std::int64_t first = index * chunk, count = std::min(chunk, test_size - first);
    return std::pair{first + count * dp_rank / dp, first + count * (dp_rank + 1) / dp};
  };
  const auto chunks = static_cast<int>((test_size + chunk - 1) / chunk);
  const LossTotals local = executor_->run(
      strategies_->schedule(chunks, false),
      {.training = false,
       .micro_batches = chunks,
       .loss_kind = loss_kind_,
       .loss_samples = test_size,
       .rows = [&](int index) { return slice(index).second - slice(index).first; },
       .read = [&](int index, MicroBatchActivations& activations) {
         std::vector<std::int64_t> indices(static_cast<std::size_t>(activations.rows));
         std::iota(indices.begin(), indices.end(), slice(index).first);
         read_samples(Split::test, indices, activations);
       }});
  record_span(trace_.get(), "evaluate", start_ms, now_ms());
  double totals[3] = {counts_loss() ? local.loss_sum : 0.0, counts_loss() ? local.correct : 0.0,
                      read_problem() ? 1.0 : 0.0};
  world_sum(totals, 3);
  stop_on_read_problem(totals[2]);
  record.eval_loss = totals[0] / loss_normalizer(loss_kind_, test_size, specs_.back().out_features);
  if (loss_kind_ == LossKind::cross_entropy)
    record.eval_accuracy = totals[1] / static_cast<double>(test_size);
  note_peaks();
}

CheckpointScope Trainer::checkpoint_scope() {
  return {.world = groups_->world(),
          .mpi_comm = mpi_world_,
          .allocator = *device_.memory,
          .global_tensors = model_parameter_tensors(specs_, 0, config_.layers),
          .layer_count = config_.layers};
}

void Trainer::save(std::int64_t step) {
  optimizer_->finish_update();
  // A checkpoint is only ever written of finite parameters.
  double square_sum = AdamW::owned_square_sum(*device_.kernels, placement_.updated, AdamW::Field::values);
  world_sum(&square_sum, 1);
  if (!std::isfinite(square_sum))
    throw AgreedError(ExitCode::runtime_failure,
                      fmt::format("step {}: the parameters are not finite; no checkpoint written", step));
  const GridShape& shape = groups_->shape();
  const CheckpointDescription description{
      .config_ini = to_ini(config_),
      .layout = fmt::format("dp={} tp={} pp={} ep={} zero={}", shape.dp, shape.tp, shape.pp,
                            shape.ep, config_.zero),
      .seed = config_.seed};
  const std::string path =
      save_checkpoint(config_.checkpoint_dir, state(step), description, checkpoint_scope());
  reporter_->line("saved checkpoint " + path);
}

void Trainer::train() {
  reporter_->line(describe_run());
  std::int64_t start = 0;
  if (!config_.resume.empty()) {
    TrainingState loaded = state(0);
    const std::string file = load_checkpoint(config_.resume, loaded, checkpoint_scope());
    start = loaded.step;
    batch_.resumed_step = loaded.step;
    batch_.resumed_position = loaded.data_position;
    reporter_->line(fmt::format("resumed from {} at step {} (sample position {})", file, start,
                                loaded.data_position));
    if (start >= config_.steps)
      reporter_->line(fmt::format("the checkpoint is at or beyond --steps {}: nothing to train",
                                  config_.steps));
  }
  RunSummary summary;
  std::int64_t last_saved = -1;
  Watchdog watchdog(config_.timeout_s, groups_->world().rank(), comm_ledger_);
  for (std::int64_t step = start; step < config_.steps; ++step) {
    watchdog.arm(step + 1);
    StepRecord record = train_step(step);
    if (config_.eval_every > 0 && record.step % config_.eval_every == 0) evaluate(record);
    reporter_->step(record);
    summary.add(record);
    if (!config_.checkpoint_dir.empty() && config_.save_every > 0 &&
        record.step % config_.save_every == 0) {
      watchdog.arm(record.step);  // the save gets a timeout of its own
      save(record.step);
      last_saved = record.step;
    }
  }
  optimizer_->finish_update();
  watchdog.disarm();
  const std::int64_t final_step = std::max<std::int64_t>(start, config_.steps);
  if (!config_.checkpoint_dir.empty() && last_saved != final_step &&
      !(start >= config_.steps && !config_.resume.empty()))
    save(final_step);

  note_peaks();
  summary.peak_memory = run_peak_;
  summary.peak_host_memory = host_memory_.peak();
  summary.prediction = predict();
  // Exchanged experts' rows follow the routing: the counts measured give the prediction.
  if (!moe_layers_.empty() && summary.steps > 0)
    summary.prediction.comm(CommOp::all_to_all) =
        std::llround(summary.routed_all_to_all_bytes_sum / static_cast<double>(summary.steps));
  Communicator& world = groups_->world();
  std::vector<std::int64_t> all(static_cast<std::size_t>(memory_state_count * world.size()));
  world.all_gather(run_peak_.data(), all.data(), memory_state_count);
  for (int rank = 0; rank < world.size(); ++rank) {
    MemoryByState peaks{};
    std::copy_n(all.begin() + rank * memory_state_count, memory_state_count, peaks.begin());
    summary.peak_memory_by_rank.push_back(peaks);
  }
  if (summary.steps > 0) reporter_->summary(summary);
  write_trace_file();
}

void Trainer::write_trace_file() {
  if (!trace_) return;
  const GridShape& shape = groups_->shape();
  const nlohmann::json run = {{"world", shape.world}, {"dp", shape.dp}, {"tp", shape.tp},
                              {"pp", shape.pp}, {"ep", shape.ep}, {"zero", config_.zero},
                              {"strategies", strategies_->names()}, {"schedule", config_.schedule},
                              {"micro_batches", config_.micro_batches},
                              {"global_batch", config_.global_batch}, {"layers", config_.layers}};
  agree_or_throw(groups_->world(), [&] {
    write_trace(config_.trace_path, *trace_, trace_origin_ms_, mpi_world_, groups_->place(), run);
  });
  reporter_->line("wrote trace " + config_.trace_path);
}

}  // namespace

void run_training(const Config& config, MPI_Comm world, const CommSettings& comm) {
  Trainer trainer(config, world, comm);
  if (config.predict) {
    trainer.predict_only();
  } else {
    trainer.train();
  }
}

}  // namespace mlptrain
