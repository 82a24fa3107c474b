// Saving and resuming the run's state (see checkpointer.hpp).
#include "train/checkpointer.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"
#include "train/options.hpp"

namespace mlptrain {

CheckpointScope Checkpointer::scope() const {
  const Config& config = run_.config;
  return {.world = run_.world(),
          .mpi_comm = run_.mpi_world,
          .allocator = *run_.device.memory,
          .global_tensors = model_parameter_tensors(run_.model->specs, 0, config.layers),
          .layer_count = config.layers,
          .config_ini = to_ini(config),
          .shape_options = model_shape_options()};
}

TrainingState Checkpointer::state(std::int64_t step) const {
  const StatePlacement& placement = run_.model->placement;
  return {placement.updated, placement.held, step, run_.batch.step_position(step)};
}

Checkpointer::Resumed Checkpointer::resume() {
  TrainingState loaded = state(0);
  const std::string file = load_checkpoint(run_.config.resume, loaded, scope());
  run_.batch.resumed_step = loaded.step;
  run_.batch.resumed_position = loaded.data_position;
  return {loaded.step, file};
}

std::string Checkpointer::save(std::int64_t step) {
  AdamW& optimizer = *run_.model->optimizer;
  optimizer.finish_update();
  // A checkpoint is only ever written of finite parameters.
  double square_sum =
      AdamW::owned_square_sum(*run_.device.kernels, run_.model->placement.updated, AdamW::Field::values);
  if (run_.world().size() > 1) run_.world().all_reduce(&square_sum, 1);
  if (!std::isfinite(square_sum))
    throw AgreedError(ExitCode::runtime_failure,
                      fmt::format("step {}: the parameters are not finite; no checkpoint written", step));
  const GridShape& shape = run_.groups->shape();
  const CheckpointDescription description{
      .config_ini = to_ini(run_.config),
      .layout = fmt::format("dp={} tp={} pp={} ep={} zero={}", shape.dp, shape.tp, shape.pp, shape.ep,
                            run_.config.zero),
      .seed = run_.config.seed};
  return save_checkpoint(run_.config.checkpoint_dir, state(step), description, scope());
}

}  // namespace mlptrain
