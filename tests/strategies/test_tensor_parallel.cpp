// Tensor parallelism's conjugate functions f and g at whatever world size mpiexec gives, through
// the real path (plan, hooks, runner): a model of column/row pairs and a replicated last layer,
// split over all ranks, gives the one-process forward output, loss and every parameter's
// gradient (each rank's slice of them).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "comm/process_groups.hpp"
#include "core/rng.hpp"
#include "model/state_runs.hpp"
#include "train/model_runner.hpp"
#include "train/strategy_stack.hpp"

using namespace mlptrain;

namespace {

// One model on a set of ranks: its plan, store, strategies and runner.
struct Replica {
  MemoryLedger memory;
  HostAllocator allocator{memory};
  CommLedger ledger;
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  Config config;
  std::vector<LayerSpec> specs;
  std::unique_ptr<ProcessGroups> groups;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<StrategyStack> strategies;
  std::unique_ptr<ModelRunner> runner;

  Replica(MPI_Comm comm, int layers) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    config.layers = layers;
    config.hidden = 12;
    config.tp = size;
    config.dp = 1;
    specs = model_layer_specs(layers, 6, config.hidden, 5);
    const GridShape shape{.world = size, .tp = size, .dp = 1, .pp = 1, .ep = 1};
    groups = std::make_unique<ProcessGroups>(comm, shape, ledger);
    const ParameterPlan plan = StrategyStack::plan(config, shape, groups->place());
    store = std::make_unique<ParameterStore>(model_parameter_tensors(specs, 0, layers, plan), allocator, plan);
    strategies = std::make_unique<StrategyStack>(StrategyContext{
        config, *groups, *kernels, allocator, *store, specs, 0, layers});
    initialize_values(store_placement(*store, shape, groups->place()).held, 99, allocator);
    runner = std::make_unique<ModelRunner>(*kernels, allocator, *store, specs, 0, layers, *strategies);
  }

  // One training micro-batch; returns the loss sum and leaves the model output in `output`.
  double step(std::vector<float>& output) {
    const std::int64_t rows = 7;
    MicroBatchActivations activations = runner->prepare(rows, LossKind::mse);
    CounterRng(3, "inputs").fill_normal(activations.input.floats(), 0, rows * 6, 0.0f, 1.0f);
    CounterRng(3, "targets").fill_normal(activations.targets.floats(), 0, rows * 5, 0.0f, 1.0f);
    const LossSums sums = runner->forward(activations, 0, 1, true, LossKind::mse, rows);
    const float* last = activations.pre.back().floats();
    output.assign(last, last + rows * 5);
    runner->backward(activations, 0, 1);
    return sums.loss_sum;
  }
};

void check_against_one_process(int layers) {
  Replica split(MPI_COMM_WORLD, layers), whole(MPI_COMM_SELF, layers);
  std::vector<float> split_output, whole_output;
  const double split_loss = split.step(split_output);
  const double whole_loss = whole.step(whole_output);
  EXPECT_NEAR(split_loss, whole_loss, 1e-5 * whole_loss);
  ASSERT_EQ(split_output.size(), whole_output.size());
  for (std::size_t i = 0; i < whole_output.size(); ++i) EXPECT_NEAR(split_output[i], whole_output[i], 1e-5);
  // Every rank's slice of every gradient (and value) equals the same slice of the whole.
  for (const ParameterTensor& tensor : split.store->tensors()) {
    const ParameterTensor& full = whole.store->tensor(tensor.path);
    for_each_run(tensor.global_shape, tensor.local_start, tensor.local_shape,
                 [&](std::int64_t global, std::int64_t local, std::int64_t count) {
                   for (std::int64_t i = 0; i < count; ++i) {
                     const auto mine = tensor.offset + local + i, theirs = full.offset + global + i;
                     ASSERT_EQ(split.store->values()[mine], whole.store->values()[theirs]) << tensor.path;
                     ASSERT_NEAR(split.store->grads()[mine], whole.store->grads()[theirs], 1e-5) << tensor.path;
                   }
                 });
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) {
    EXPECT_LT(split.store->size(), whole.store->size());  // the pairs are split
    EXPECT_GT(split.ledger.by_group().at("tp").bytes_of(CommOp::all_reduce), 0);
  }
}

}  // namespace

TEST(TensorParallel, PairsMatchOneProcessForwardAndBackward) { check_against_one_process(4); }

TEST(TensorParallel, AnUnpairedLastLayerIsReplicated) { check_against_one_process(5); }
