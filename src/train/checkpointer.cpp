// Saving and resuming the run's state (see checkpointer.hpp).
#include "train/checkpointer.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "core/timer.hpp"
#include "core/trace.hpp"
#include "command_line/parser.hpp"

namespace mlptrain {

CheckpointScope Checkpointer::scope() const {
  const Config& config = run_.config;
  return {.world = run_.world(),
          .mpi_comm = run_.mpi_world,
          .allocator = *run_.device.memory,
          .global_tensors = model_parameter_tensors(run_.model->specs, 0, config.model.layers),
          .layer_count = config.model.layers,
          .config_ini = to_ini(config),
          .shape_options = model_shape_options()};
}

TrainingState Checkpointer::state(const Progress& progress) const {
  return {.placement = run_.model->placement,
          .step = progress.step,
          .optimizer_step = progress.optimizer_step,
          .data_position = run_.data->batch().step_position(progress.step),
          .loss_scale = progress.loss_scale,
          .loss_scale_finite_steps = progress.loss_scale_finite_steps};
}

std::optional<std::string> Checkpointer::resume_source() {
  const OutputConfig& output = run_.config.output;
  if (output.resume != resume_auto) return output.resume.empty() ? std::nullopt : std::optional(output.resume);
  // Rank 0 looks, and every rank follows: ranks must not see the folder differently.
  int found = run_.world().rank() == 0 && std::filesystem::exists(std::filesystem::path(output.checkpoint_dir) / "latest");
  run_.world().broadcast(&found, 1, 0);
  return found != 0 ? std::optional(output.checkpoint_dir) : std::nullopt;
}

Checkpointer::Resumed Checkpointer::resume(const std::string& source, const Progress& start) {
  TrainingState loaded = state(start);
  const std::string file = load_checkpoint(source, loaded, scope());
  run_.data->batch().resumed_step = loaded.step;
  run_.data->batch().resumed_position = loaded.data_position;
  return {{.step = loaded.step,
           .optimizer_step = loaded.optimizer_step,
           .loss_scale = loaded.loss_scale,
           .loss_scale_finite_steps = loaded.loss_scale_finite_steps},
          file};
}

void Checkpointer::prepare() { saver_.prepare(run_.model->placement, scope()); }

std::vector<SavedCheckpoint> Checkpointer::save(const Progress& progress, bool steps_follow) {
  const double start_ms = now_ms();
  run_.data->finish_reads();
  run_.model->optimizer->finish_update();
  const GridShape& shape = run_.groups->shape();
  const CheckpointDescription description{
      .config_ini = to_ini(run_.config),
      .layout = layout_words(shape, run_settings(run_.config, shape)),
      .seed = run_.config.training.seed};
  std::vector<SavedCheckpoint> ended;
  if (saver_.in_flight()) ended.push_back(finish());
  const bool background = run_.config.output.save_mode == SaveMode::async && steps_follow;
  saver_.start(run_.config.output.checkpoint_dir, state(progress), description, scope(), background);
  if (!background) ended.push_back(finish());
  record_span(run_.ledgers.trace.get(), "checkpoint", start_ms, now_ms());
  return ended;
}

SavedCheckpoint Checkpointer::finish() {
  run_.data->finish_reads();
  const SavedCheckpoint saved = saver_.finish(run_.world());
  const OutputConfig& output = run_.config.output;
  if (output.keep_last != keep_all_checkpoints && run_.world().rank() == 0)
    retire_checkpoints(output.checkpoint_dir, output.keep_last);
  if (TraceRecorder* trace = run_.ledgers.trace.get())
    trace->record({.name = "checkpoint_write",
                   .track = TraceTrack::storage,
                   .start_ms = saved.write_start_ms,
                   .end_ms = saved.write_end_ms,
                   .bytes = static_cast<std::int64_t>(saved.rank_bytes)});
  return saved;
}

}  // namespace mlptrain
