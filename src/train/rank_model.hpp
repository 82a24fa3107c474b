// The model part of a run on one rank, built in the one order that works: the strategies' plan
// and the rank's layers give the parameter store; the strategies' objects come next (they may
// move parameter memory to where their groups communicate); then the state's placement, the
// optimizer over that state (which places the fp32 masters of a 16-bit run), the initial values
// (every layout starts from the same model: values are a function of (seed, tensor, index)), and
// last the runners (one per model chunk), whose views into the store are taken after every move. The run builds one (train/run.hpp); tests build one around
// their own groups and inputs.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "device/compute_device.hpp"
#include "strategies/rank_plan.hpp"
#include "model/parameter_store.hpp"
#include "model/state_ranges.hpp"
#include "chunk/chunk_runner.hpp"
#include "optimizer/optimizer.hpp"
#include "strategies/strategy_stack.hpp"

namespace mlptrain {

// Runs an allocation where a failure must become one error on every rank (the run agrees on it
// over the world); by default it simply runs.
using AllocationGuard = std::function<void(const std::function<void()>& allocate)>;

struct RankModel {
  // `strategies`: those that take part (wanted_strategies); `offload`: the host memory and
  // kernels that keep and update the optimizer state (--offload).
  RankModel(const Config& config, const ProcessGroups& groups, Kernels& kernels, Allocator& allocator,
            std::vector<LayerSpec> model_specs, const Strategies& strategies, HostSide* offload = nullptr,
            const AllocationGuard& guard = [](const std::function<void()>& allocate) { allocate(); });
  RankModel(const RankModel&) = delete;  // the runner's forward gate refers to this optimizer
  RankModel& operator=(const RankModel&) = delete;

  std::vector<LayerSpec> specs;  // the whole model
  std::vector<int> moe_layers;   // the whole model's MoE layers, in order
  Strategies taking_part;        // the registrations of the strategies that take part
  RankLayers layers;             // this rank's
  std::unique_ptr<ParameterStore> parameters;
  std::unique_ptr<StrategyStack> strategies;
  StatePlacement placement;
  std::unique_ptr<AdamW> optimizer;
  std::vector<std::unique_ptr<ChunkRunner>> runners;  // per chunk, in local order
  // A strategy shards the state, so it reads the updated values right after the step (it
  // gathers them): an offloaded update must be complete by then.
  bool values_read_after_step = false;

  // Across the chunks: whether the rank starts the model (reads inputs), computes the loss, the
  // runners as the executor takes them, the routing statistics since the last call, and the
  // most each chunk's MoE layers kept for one training micro-batch.
  bool reads_inputs() const { return runners.front()->reads_inputs(); }
  bool computes_loss() const { return runners.back()->computes_loss(); }
  DataType activation_type() const { return runners.front()->activation_type(); }
  std::vector<ChunkRunner*> chunk_runners() const;
  MoeStatistics take_moe_statistics();
  std::vector<std::int64_t> largest_moe_bytes() const;
};

}  // namespace mlptrain
