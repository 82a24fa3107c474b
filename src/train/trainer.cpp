// The training loop (see trainer.hpp): a step runs the schedule's actions, synchronizes the
// gradients, agrees on the step's world sums, and updates (or skips) the parameters; every
// --eval-every steps an evaluation pass, every --save-every steps a checkpoint, whose writes go
// on behind the following steps until every rank's have ended. A stop signal on any rank ends
// the run after the step whose world sums carried it, saved there.
#include "train/trainer.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "comm/consensus.hpp"
#include "core/timer.hpp"
#include "strategies/rank_plan.hpp"
#include "train/checkpointer.hpp"
#include "optimizer/loss_scaler.hpp"
#include "train/run.hpp"
#include "train/run_description.hpp"
#include "train/step_totals.hpp"
#include "train/stop_signals.hpp"
#include "train/watchdog.hpp"

namespace mlptrain {

namespace {

class Trainer {
 public:
  Trainer(const Config& config, MPI_Comm world, const CommSettings& comm)
      : run_(config, world, comm), checkpoints_(run_), config_(config),
        flops_(step_flops(run_.model->taking_part, config, run_.model->specs, run_.groups->shape())),
        peak_tflops_(config.device.peak_tflops > 0 ? config.device.peak_tflops : run_.device.peak_tflops) {
    note_peaks();
  }
  void predict_only();
  ExitCode train();

 private:
  StepRecord train_step(std::int64_t step);
  // The step's update from its agreed totals: clipped, skipped or stopped as the options say.
  struct UpdateOutcome {
    bool skipped = false;
    double update_ms = 0;  // the optimizer's own update, without the norm's reductions
  };
  UpdateOutcome update(std::int64_t step, double learning_rate, StepTotals& totals);
  void evaluate(StepRecord& record);
  // This rank's part of the world sums: the loss where it counts, read failures, MoE figures.
  StepTotals local_totals(const LossTotals& local, const MoeStatistics* moe) const;
  // A read that failed on some rank stops every rank with that rank's message.
  void stop_on_read_problem(double ranks_with_problems) const;
  // A non-finite loss or gradient norm stops every rank unless --on-nan skip.
  void stop_unless_skipping(std::int64_t step, const StepTotals& totals) const;
  Checkpointer::Progress progress(std::int64_t step) const {
    return {.step = step,
            .optimizer_step = optimizer_step_,
            .loss_scale = scaler_.scales() ? scaler_.scale() : 0.0,
            .loss_scale_finite_steps = scaler_.finite_steps()};
  }
  void note_peaks() {
    for (int state = 0; state < memory_state_count; ++state)
      run_peak_[state] = std::max(run_peak_[state], run_.ledgers.memory.peak()[state]);
  }

  StopSignals stop_signals_;  // first: a signal during the set-up stops the run after its first step
  Run run_;
  Checkpointer checkpoints_;
  const Config& config_;
  const StepFlops flops_;     // the whole job's, per step
  const double peak_tflops_;  // a rank's (0: unknown)
  MemoryByState run_peak_{};
  LossScaler scaler_{config_};
  std::int64_t optimizer_step_ = 0;  // updates applied: AdamW's step (skipped steps do not count)
};

StepTotals Trainer::local_totals(const LossTotals& local, const MoeStatistics* moe) const {
  StepTotals totals{.loss_sum = run_.counts_loss() ? local.loss_sum : 0.0,
                    .correct = run_.counts_loss() ? local.correct : 0.0,
                    .read_problems = run_.data->problem() ? 1.0 : 0.0};
  if (moe == nullptr || run_.model->moe_layers.empty()) return totals;
  // Routing figures are global already: one rank of each stage's data and tensor groups counts them.
  const bool counts = run_.groups->place().dp == 0 && run_.groups->place().tp == 0;
  totals.aux_loss = counts ? moe->aux_loss : 0.0;
  totals.dropped = counts ? moe->dropped : 0.0;
  for (int layer : run_.model->moe_layers) {
    const auto found = moe->expert_load.find(layer);
    std::vector<double>& loads = totals.expert_load.emplace_back(static_cast<std::size_t>(config_.model.experts), 0.0);
    if (counts && found != moe->expert_load.end()) loads = found->second;
  }
  return totals;
}

void Trainer::stop_on_read_problem(double ranks_with_problems) const {
  if (ranks_with_problems == 0) return;
  const auto message = first_problem(run_.world(), run_.data->problem());
  throw AgreedError(ExitCode::runtime_failure, message.value_or("reading the data failed"));
}

void Trainer::stop_unless_skipping(std::int64_t step, const StepTotals& totals) const {
  if (config_.training.on_nan == OnNonFinite::skip) return;
  throw AgreedError(ExitCode::runtime_failure,
                    fmt::format("step {}: the loss is {} and the gradient norm {}; stopping before this state "
                                "reaches a checkpoint (lower --lr, clip with --grad-clip, or skip such steps "
                                "with --on-nan skip)",
                                step + 1, std::isfinite(totals.loss_sum) ? "finite" : "not finite",
                                std::isfinite(totals.grad_square_sum) ? "finite" : "not finite"));
}

Trainer::UpdateOutcome Trainer::update(std::int64_t step, double learning_rate, StepTotals& totals) {
  Kernels& kernels = *run_.device.kernels;
  AdamW& optimizer = *run_.model->optimizer;
  const StatePlacement& placement = run_.model->placement;
  // The optimizer's own update, timed apart from the norm's reductions around it; returns the
  // square sum of the gradients its pass read.
  UpdateOutcome outcome;
  const auto timed_update = [&](float grad_scale) {
    const double start_ms = now_ms();
    const double square_sum = optimizer.update(kernels, placement, learning_rate, ++optimizer_step_, grad_scale);
    outcome.update_ms = now_ms() - start_ms;
    return square_sum;
  };
  if (config_.training.grad_clip > 0 || config_.training.on_nan == OnNonFinite::skip || scaler_.scales()) {
    // The norm first: clipping scales by it, and a non-finite one skips the update. Gradients of
    // a scaled loss are scaled: the norm and the update divide the scale out (in fp32).
    const double unscale = 1.0 / scaler_.scale();
    totals.grad_square_sum = AdamW::owned_square_sum(kernels, placement) * unscale * unscale;
    totals.sum_over(run_.world());
    stop_on_read_problem(totals.read_problems);
    if (!totals.finite()) {
      // Gradients overflowing from a finite loss are what a dynamic scale probes for.
      if (scaler_.dynamic() && std::isfinite(totals.loss_sum)) {
        scaler_.overflowed_step();
        return {.skipped = true};
      }
      stop_unless_skipping(step, totals);
      return {.skipped = true};
    }
    const double coefficient =
        config_.training.grad_clip > 0 ? clip_coefficient(config_.training.grad_clip, std::sqrt(totals.grad_square_sum)) : 1.0;
    timed_update(static_cast<float>(unscale * std::min(coefficient, 1.0)));
    scaler_.finite_step();
    return outcome;
  }
  // Without clipping the norm comes free from the update's own pass over the gradients. A
  // non-finite one then stops the run after the update, which never reaches a checkpoint.
  totals.grad_square_sum = timed_update(1.0f);
  totals.sum_over(run_.world());
  stop_on_read_problem(totals.read_problems);
  if (!totals.finite()) stop_unless_skipping(step, totals);
  return outcome;
}

StepRecord Trainer::train_step(std::int64_t step) {
  const double start_ms = now_ms();
  run_.ledgers.begin_step(step);
  StrategyStack& strategies = *run_.model->strategies;
  const StepEvent event{.step = step};
  strategies.before_step(event);
  const double loss_scale = scaler_.scale();  // the step's, before an overflow changes it

  const LossTotals local = run_.executor->run(
      run_.schedule,
      {.training = true,
       .micro_batches = config_.data.micro_batches,
       .loss_kind = run_.data->loss_kind(),
       .loss_samples = config_.data.global_batch,
       .loss_scale = scaler_.scale(),
       .rows = [&](int) { return run_.data->batch().local_size(); },
       .read = [&](int micro_batch, MicroBatchActivations& activations, bool inputs) {
         run_.data->read_training(step, micro_batch, activations, inputs);
       }});
  const double synchronize_start_ms = now_ms();
  strategies.synchronize_gradients(event);
  record_span(run_.ledgers.trace.get(), "synchronize_gradients", synchronize_start_ms, now_ms());

  const double optimizer_start_ms = now_ms();
  const MoeStatistics moe = run_.model->take_moe_statistics();
  StepTotals totals = local_totals(local, &moe);
  totals.data_wait_ms = run_.data->take_wait_ms();
  totals.checkpoint_writers = checkpoints_.writing() ? 1.0 : 0.0;
  // Joins the step's world sum: every rank stops after the same step, whichever got the signal.
  totals.stop_requests = stop_signals_.received() != 0 ? 1.0 : 0.0;
  const double learning_rate = scheduled_learning_rate(config_, step);
  const UpdateOutcome outcome = update(step, learning_rate, totals);
  if (run_.model->values_read_after_step) run_.model->optimizer->finish_update();
  strategies.after_optimizer_step(event);
  record_span(run_.ledgers.trace.get(), "optimizer", optimizer_start_ms, now_ms());

  StepRecord record;
  record.step = step + 1;
  record.skipped = outcome.skipped;
  record.stopped = totals.stop_requests > 0;
  record.update_ms = outcome.update_ms;
  if (scaler_.scales()) {
    record.loss_scale = loss_scale;
    record.skipped_steps = scaler_.skipped_steps();
  }
  record.loss = totals.loss_sum / loss_normalizer(run_.data->loss_kind(), config_.data.global_batch,
                                                  run_.model->specs.back().out_features);
  record.lr = learning_rate;
  record.grad_norm = std::sqrt(totals.grad_square_sum);
  if (!run_.model->moe_layers.empty()) {
    record.aux_loss = totals.aux_loss / config_.data.micro_batches;
    record.dropped_tokens = std::llround(totals.dropped);
    for (const std::vector<double>& loads : totals.expert_load) {
      std::vector<std::int64_t>& experts = record.expert_load.emplace_back();
      for (double load : loads) experts.push_back(std::llround(load));
    }
  }
  record.routed_all_to_all_bytes = moe.all_to_all_bytes;
  record.step_ms = now_ms() - start_ms;
  record.data_ms = totals.data_wait_ms / run_.groups->shape().world;
  record.samples_per_s = static_cast<double>(config_.data.global_batch) / (record.step_ms / 1000.0);
  const double rank_seconds = record.step_ms / 1000.0 * run_.groups->shape().world;
  record.model_tflops = flops_.model / rank_seconds / 1e12;
  record.recompute_tflops = flops_.recompute / rank_seconds / 1e12;
  if (peak_tflops_ > 0) record.mfu = record.model_tflops / peak_tflops_;
  record.comm = run_.ledgers.comm.step();
  record.comm_wall = run_.ledgers.comm.step_wall_time();
  record.memory = run_.ledgers.memory.current();
  record.peak_memory = run_.ledgers.memory.peak();
  note_peaks();
  // Every rank sees the same count: a save whose writes have ended everywhere ends here, after
  // the step's traffic is recorded (a save's own belongs to no step).
  if (checkpoints_.saving() && totals.checkpoint_writers == 0) record.checkpoint = checkpoints_.finish();
  return record;
}

void Trainer::evaluate(StepRecord& record) {
  const double start_ms = now_ms();
  const std::int64_t test_size = run_.data->info().test_size;
  const std::int64_t chunk = run_.data->batch().micro_batch_size();
  const int dp = run_.groups->shape().dp, dp_rank = run_.groups->place().dp;
  // The test split in micro-batch sized chunks, each spread over the data-parallel ranks.
  const auto slice = [&](int index) {
    const std::int64_t first = index * chunk, count = std::min(chunk, test_size - first);
    return std::pair{first + count * dp_rank / dp, first + count * (dp_rank + 1) / dp};
  };
  const auto chunks = static_cast<int>((test_size + chunk - 1) / chunk);
  const LossTotals local = run_.executor->run(
      rank_schedule(run_.model->taking_part, config_, run_.groups->shape(), run_.groups->place(), chunks, false),
      {.training = false,
       .micro_batches = chunks,
       .loss_kind = run_.data->loss_kind(),
       .loss_samples = test_size,
       .rows = [&](int index) { return slice(index).second - slice(index).first; },
       .read = [&](int index, MicroBatchActivations& activations, bool inputs) {
         std::vector<std::int64_t> indices(static_cast<std::size_t>(activations.rows));
         std::iota(indices.begin(), indices.end(), slice(index).first);
         run_.data->read(Split::test, indices, activations, inputs);
       }});
  record_span(run_.ledgers.trace.get(), "evaluate", start_ms, now_ms());
  StepTotals totals = local_totals(local, nullptr);
  totals.sum_over(run_.world());
  stop_on_read_problem(totals.read_problems);
  record.eval_loss =
      totals.loss_sum / loss_normalizer(run_.data->loss_kind(), test_size, run_.model->specs.back().out_features);
  if (run_.data->loss_kind() == LossKind::cross_entropy) record.eval_accuracy = totals.correct / static_cast<double>(test_size);
  note_peaks();
}

void Trainer::predict_only() {
  run_.reporter->line(describe_run(run_));
  run_.reporter->prediction(predict_this_rank(run_), config_.precision.types(), parameter_count(run_.model->specs));
}

ExitCode Trainer::train() {
  Reporter& reporter = *run_.reporter;
  reporter.line(describe_run(run_));
  RunSummary summary;
  std::int64_t start = 0;
  const OutputConfig& output = config_.output;
  const std::optional<std::string> resume_source = checkpoints_.resume_source();
  if (output.resume == resume_auto)
    reporter.line(resume_source
                      ? fmt::format("--resume auto: continuing from {}/latest", output.checkpoint_dir)
                      : fmt::format("--resume auto: no checkpoint in {} yet: starting afresh", output.checkpoint_dir));
  if (resume_source) {
    const Checkpointer::Resumed resumed = checkpoints_.resume(*resume_source, progress(0));
    start = resumed.progress.step;
    optimizer_step_ = resumed.progress.optimizer_step;
    if (scaler_.scales()) scaler_.resume_at(resumed.progress.loss_scale, resumed.progress.loss_scale_finite_steps);
    reporter.line(fmt::format("resumed from {} at step {} (sample position {})", resumed.file, start,
                              run_.data->batch().resumed_position));
    if (start >= config_.training.steps)
      reporter.line(fmt::format("the checkpoint is at or beyond --steps {}: nothing to train", config_.training.steps));
  }
  const auto saved = [&](const SavedCheckpoint& checkpoint) {
    reporter.line(saved_line(checkpoint));
    summary.checkpoints.push_back(checkpoint);
  };
  const auto save = [&](std::int64_t step) {
    for (const SavedCheckpoint& checkpoint : checkpoints_.save(progress(step), step < config_.training.steps))
      saved(checkpoint);
  };
  // A save that steps will follow copies the state into host memory first: made ready now.
  const std::int64_t first_periodic_save =
      output.save_every > 0 ? (start / output.save_every + 1) * output.save_every : config_.training.steps;
  if (!output.checkpoint_dir.empty() && output.save_mode == SaveMode::async &&
      first_periodic_save < config_.training.steps)
    checkpoints_.prepare();
  std::int64_t last_saved = -1;
  std::optional<std::int64_t> stopped_at;  // the step a stop signal ended the run after
  Watchdog watchdog(config_.output.timeout_s, run_.world().rank(), run_.ledgers.comm);
  try {
    for (std::int64_t step = start; step < config_.training.steps && !stopped_at; ++step) {
      watchdog.arm(step + 1);
      StepRecord record = train_step(step);
      if (config_.data.eval_every > 0 && record.step % config_.data.eval_every == 0) evaluate(record);
      reporter.step(record);
      if (record.checkpoint) saved(*record.checkpoint);
      summary.add(record);
      if (!output.checkpoint_dir.empty() && output.save_every > 0 && record.step % output.save_every == 0) {
        watchdog.arm(record.step);  // the save gets a timeout of its own
        save(record.step);
        last_saved = record.step;
      }
      if (record.stopped && record.step < config_.training.steps) stopped_at = record.step;
    }
  } catch (const AgreedError&) {
    // Every rank stops here alike, so a save in flight (of a state before the failure) still
    // ends; the failure that stopped the run is the one reported.
    try {
      if (checkpoints_.saving()) saved(checkpoints_.finish());
    } catch (const AgreedError&) {
    }
    throw;
  }
  run_.model->optimizer->finish_update();
  // The run ends at its last step, or at the one a stop signal ended it after; either is saved
  // (synchronously: no step follows), unless that step was saved already.
  const std::int64_t final_step = stopped_at.value_or(std::max<std::int64_t>(start, config_.training.steps));
  watchdog.arm(final_step);
  if (!output.checkpoint_dir.empty() && last_saved != final_step && !(start >= config_.training.steps && resume_source))
    save(final_step);
  if (checkpoints_.saving()) saved(checkpoints_.finish());
  watchdog.disarm();

  note_peaks();
  complete_summary(run_, run_peak_, summary);
  if (summary.steps > 0) reporter.summary(summary);
  write_trace_file(run_);
  if (!stopped_at) return ExitCode::success;
  const int signal = stop_signals_.received();
  const std::string cause = signal != 0 ? std::string(StopSignals::name(signal)) : "a stop signal to another rank";
  const std::string kept = output.checkpoint_dir.empty()
                               ? "nothing saved (no --checkpoint-dir)"
                               : fmt::format("saved in {} (rerun with --resume auto to continue)", output.checkpoint_dir);
  reporter.line(fmt::format("stopped by {} after step {} of {}: {}", cause, *stopped_at, config_.training.steps, kept));
  return ExitCode::stopped;
}

}  // namespace

ExitCode run_training(const Config& config, MPI_Comm world, const CommSettings& comm) {
  Trainer trainer(config, world, comm);
  if (config.output.predict) {
    trainer.predict_only();
    return ExitCode::success;
  }
  return trainer.train();
}

}  // namespace mlptrain
