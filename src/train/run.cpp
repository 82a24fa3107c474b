// Building a run (see run.hpp).
#include "train/run.hpp"

#include <fmt/format.h>

#include <exception>

#include "comm/consensus.hpp"
#include "core/timer.hpp"
#include "io/checkpoint.hpp"
#include "command_line/parser.hpp"
#include "strategies/rank_plan.hpp"
#include "report/trace_file.hpp"

namespace mlptrain {

namespace {

// Agrees over `world` on running `allocate`: running out of memory anywhere is one clear error
// everywhere, naming what to change.
AllocationGuard agreed_allocation(Communicator& world, std::int64_t parameters) {
  return [&world, parameters](const std::function<void()>& allocate) {
    agree_or_throw(world, [&] {
      try {
        allocate();
      } catch (const std::bad_alloc&) {
        throw RuntimeFailure(fmt::format(
            "out of memory: the model's {} parameters need up to {:.1f} GiB per rank for values, "
            "gradients and AdamW state (--hidden, --layers, --zero)",
            parameters, 16.0 * static_cast<double>(parameters) / (1 << 30)));
      }
    });
  };
}

}  // namespace

Run::Run(const Config& run_config, MPI_Comm world_comm, const CommSettings& comm)
    : config(run_config), mpi_world(world_comm) {
  int world_size = 1;
  MPI_Comm_size(mpi_world, &world_size);
  const GridShape shape = grid_shape(config, world_size);
  // The device first (its staging carries the groups' messages); a problem opening it is agreed
  // on once the groups exist.
  std::exception_ptr device_problem;
  try {
    device = open_compute_device(config, world_comm, ledgers.memory, ledgers.host_memory);
  } catch (const Error&) {
    device_problem = std::current_exception();
  }
  groups = std::make_unique<ProcessGroups>(mpi_world, shape, communicator_factory(config, device, ledgers.comm, comm));
  agree_or_throw(world(), [&] {
    if (device_problem) std::rethrow_exception(device_problem);
  });

  std::unique_ptr<Dataset> dataset;
  agree_or_throw(world(), [&] {
    dataset = open_dataset({.kind = config.data.kind,
                            .path = config.data.path,
                            .input_dim = config.model.input_dim,
                            .output_dim = config.model.output_dim,
                            .memory_cap_bytes = config.data.memory_bytes()});
    if (config.data.eval_every > 0 && dataset->info().test_size == 0)
      throw UsageError("--eval-every needs a held-out split, and '" + config.data.path +
                       "' has no /x_test and /y_test");
  });
  const DatasetInfo info = dataset->info();
  std::vector<LayerSpec> specs = model_layer_specs(config.model.layers, info.input_dim, config.model.hidden, info.output_dim,
                                                   config.model.moe_every, config.model.experts, config.model.top_k);
  HostSide* offload = device.offload ? &*device.offload : nullptr;
  const Strategies strategies = wanted_strategies(config, shape);
  model = std::make_unique<RankModel>(config, *groups, *device.kernels, *device.memory, specs, strategies,
                                      offload, agreed_allocation(world(), parameter_count(specs)));

  data = std::make_unique<RunSamples>(config, std::move(dataset), *device.kernels, *device.memory,
                                   RunSamples::ModelSide{.reads_inputs = model->reads_inputs(),
                                                      .computes_loss = model->computes_loss(),
                                                      .activation_type = model->activation_type()},
                                   groups->place().dp, device.reader_threads);
  schedule = rank_schedule(strategies, config, shape, groups->place(), config.data.micro_batches, true);
  agree_or_throw(world(), [&] {
    if (!config.output.checkpoint_dir.empty() && rank_zero() && !config.output.predict)
      prepare_checkpoint_directory(config.output.checkpoint_dir);
    if (!config.output.trace_path.empty() && rank_zero() && !config.output.predict) check_trace_path(config.output.trace_path);
    reporter = std::make_unique<Reporter>(rank_zero(), config.output.metrics_path, config.output.log_every,
                                          config.training.steps);
  });
  if (!config.output.trace_path.empty() && !config.output.predict) {
    ledgers.trace = std::make_unique<TraceRecorder>();
    ledgers.comm.set_trace(ledgers.trace.get());
    world().barrier();  // the ranks' common time origin
    ledgers.trace_origin_ms = now_ms();
  }
  executor = std::make_unique<ScheduleExecutor>(model->chunk_runners(), *model->strategies, *device.memory,
                                                ledgers.trace.get());
}

}  // namespace mlptrain
