// A model on a set of ranks, built as a run builds it (train/rank_model.hpp) and fed a
// deterministic global batch through the schedule executor, for tests that hold a layout (or a
// strategy of their own) against one process. Global row i of the batch has the inputs and
// targets at index i of fixed counter-RNG streams, whichever rank reads it.
#pragma once

#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <memory>
#include <optional>
#include <string>

#include "comm/process_groups.hpp"
#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "strategies/rank_plan.hpp"
#include "train/rank_model.hpp"
#include "train/schedule_executor.hpp"

namespace mlptrain::test {

inline constexpr std::int64_t input_dim = 6;
inline constexpr std::int64_t output_dim = 5;

struct Replica {
  MemoryLedger memory;
  HostAllocator allocator{memory};
  CommLedger ledger;
  CommEngine engine;  // the trainer's runs its groups' operations
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  Config config;
  std::unique_ptr<ProcessGroups> groups;
  Strategies strategies;
  std::unique_ptr<RankModel> model;
  std::unique_ptr<ScheduleExecutor> executor;

  // `layout`'s model and parallel degrees over the ranks of `comm` (dp: the ranks left over),
  // with the registry's strategies unless `own` are given.
  Replica(MPI_Comm comm, const Config& layout, std::optional<Strategies> own = std::nullopt) : config(layout) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    config.grid.dp = size / (config.grid.tp * config.grid.pp);
    const GridShape shape{.world = size, .tp = config.grid.tp, .dp = config.grid.dp, .pp = config.grid.pp, .ep = config.grid.ep};
    groups = std::make_unique<ProcessGroups>(comm, shape, ledger, &engine);
    strategies = own ? *own : wanted_strategies(config, shape);
    model = std::make_unique<RankModel>(
        config, *groups, *kernels, allocator,
        model_layer_specs(config.model.layers, input_dim, config.model.hidden, output_dim, config.model.moe_every, config.model.experts,
                          config.model.top_k),
        strategies);
    executor = std::make_unique<ScheduleExecutor>(model->chunk_runners(), *model->strategies, allocator, nullptr);
  }

  std::int64_t local_rows() const { return config.data.global_batch / config.data.micro_batches / config.grid.dp; }

  // One training step's forwards and backwards over the schedule and the gradients' synchronization,
  // no update. Returns this rank's loss sum (0 where the loss is not computed).
  double step(std::int64_t index = 0) {
    const GridCoordinates& place = groups->place();
    const auto read = [&](int micro_batch, MicroBatchActivations& activations, bool inputs) {
      const std::int64_t first = micro_batch * config.data.global_batch / config.data.micro_batches + place.dp * local_rows();
      if (inputs) {  // drawn in fp32, rounded to the param type
        std::vector<float> drawn(static_cast<std::size_t>(activations.rows * input_dim));
        CounterRng(3, "inputs").fill_normal(drawn.data(), first * input_dim, drawn.size(), 0.0f, 1.0f);
        kernels->convert(drawn.data(), DataType::float32, activations.input.as<void>(),
                         model->placement.precision.param, drawn.size());
      }
      if (!activations.targets.empty())  // the chunk that computes the loss
        CounterRng(3, "targets").fill_normal(activations.targets.floats(), first * output_dim,
                                            activations.rows * output_dim, 0.0f, 1.0f);
    };
    model->strategies->before_step({.step = index});
    const LossTotals totals = executor->run(
        rank_schedule(strategies, config, groups->shape(), place, config.data.micro_batches, true),
        {.training = true,
         .micro_batches = config.data.micro_batches,
         .loss_kind = LossKind::mse,
         .loss_samples = config.data.global_batch,
         .rows = [&](int) { return local_rows(); },
         .read = read});
    model->strategies->synchronize_gradients({.step = index});
    return totals.loss_sum;
  }

  // The optimizer step after step(): every rank updates what it owns, and the strategies gather.
  void update(std::int64_t index = 0) {
    model->optimizer->update(*kernels, model->placement, config.training.lr, index + 1);
    model->optimizer->finish_update();
    model->strategies->after_optimizer_step({.step = index});
  }

  // Calls visit(path, global index, master weight, gradient) for every element this rank updates.
  void each_updated(const std::function<void(const std::string&, std::int64_t, float, float)>& visit) const {
    const Precision& precision = model->placement.precision;
    for (const StateRange& run : model->placement.updated)
      for (std::int64_t i = 0; i < run.count; ++i)
        visit(run.tensor->path, run.offset + i, run.master[i],
              load_element(run.grads, static_cast<std::size_t>(i), precision.reduce));
  }
  // Calls visit(path, global index, value) for every value this rank holds.
  void each_held(const std::function<void(const std::string&, std::int64_t, float)>& visit) const {
    const Precision& precision = model->placement.precision;
    for (const StateRange& run : model->placement.held)
      for (std::int64_t i = 0; i < run.count; ++i)
        visit(run.tensor->path, run.offset + i, load_element(run.values, static_cast<std::size_t>(i), precision.param));
  }

  // A one-process replica's master weight and gradient of an element (its store holds every
  // tensor whole, and its runs are the tensors).
  float value(const std::string& path, std::int64_t index) const { return run_of(path).master[index]; }
  float grad(const std::string& path, std::int64_t index) const {
    return load_element(run_of(path).grads, static_cast<std::size_t>(index), model->placement.precision.reduce);
  }
  const StateRange& run_of(const std::string& path) const {
    for (const StateRange& run : model->placement.updated)
      if (run.tensor->path == path) return run;
    throw std::logic_error("no run of " + path);
  }
};

// A small dense model: six layers of width 12 (pairs for tensor parallelism, a layer or more
// per pipeline stage), a global batch of 16 in `micro_batches` micro-batches.
inline Config small_model(int micro_batches = 1) {
  Config config;
  config.model.layers = 6;
  config.model.hidden = 12;
  config.data.global_batch = 16;
  config.data.micro_batches = micro_batches;
  config.training.seed = 99;
  return config;
}

}  // namespace mlptrain::test
