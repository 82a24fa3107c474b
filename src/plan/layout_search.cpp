// Enumerating a world's layouts (see layout_search.hpp).
#include "plan/layout_search.hpp"

#include "core/error.hpp"
#include "command_line/parser.hpp"
#include "schedule/schedule_table.hpp"
#include "strategies/pipeline_parallel/pipeline_options.hpp"
#include "strategies/tensor_parallel/tensor_options.hpp"
#include "strategies/zero/zero_options.hpp"

namespace mlptrain {

namespace {

std::vector<int> divisors(int value) {
  std::vector<int> found;
  for (int divisor = 1; divisor <= value; ++divisor)
    if (value % divisor == 0) found.push_back(divisor);
  return found;
}

// ZeRO's stages and shard sizes worth ranking: the whole data-parallel group (0), and under hybrid
// sharding the data-parallel ranks one node holds (tensor ranks are consecutive, so a node of G
// ranks holds G / tp consecutive data-parallel ranks), where that is a proper part of dp.
std::vector<ZeroOptions> sharding_choices(int dp, int tp, int ranks_per_node) {
  const int node_data_ranks = ranks_per_node % tp == 0 ? ranks_per_node / tp : 0;
  const bool hybrid = node_data_ranks > 1 && node_data_ranks < dp && dp % node_data_ranks == 0;
  std::vector<ZeroOptions> choices;
  for (int stage = 0; stage <= 3; ++stage) {
    choices.push_back({.stage = stage});
    if (stage > 0 && hybrid) choices.push_back({.stage = stage, .shard_size = node_data_ranks});
  }
  return choices;
}

// The pipeline schedules of `pp` stages with their model chunks per stage.
std::vector<PipelineOptions> schedule_choices(int pp, const std::vector<int>& virtual_stages) {
  if (pp == 1) return {{}};  // no pipeline, no schedule
  std::vector<PipelineOptions> choices;
  for (const ScheduleEntry& schedule : schedule_table()) {
    if (!schedule.chunked) choices.push_back({.schedule = schedule});
    else
      for (int chunks : virtual_stages) choices.push_back({.schedule = schedule, .virtual_stages = chunks});
  }
  return choices;
}

}  // namespace

std::vector<Config> every_layout(const Config& base, int world, int ranks_per_node, const LayoutChoices& choices) {
  std::vector<Config> layouts;
  const std::vector<bool> offloads = base.device.kind == Device::cpu ? std::vector<bool>{false} : std::vector<bool>{false, true};
  for (int tp : divisors(world)) {
    if (base.model.hidden % tp != 0) continue;  // the cheap refusals first: most splits fail here
    for (int pp : divisors(world / tp)) {
      if (pp > base.model.layers) continue;
      const int dp = world / tp / pp;
      for (int ep : base.model.moe_every > 0 ? divisors(dp) : std::vector<int>{1})
        for (int micro_batches : choices.micro_batches)
          for (const ZeroOptions& zero : sharding_choices(dp, tp, ranks_per_node))
            for (const PipelineOptions& pipeline : schedule_choices(pp, choices.virtual_stages))
              for (bool recompute : {false, true})
                for (bool sequence_parallel : {false, true})
                  for (bool offload : offloads) {
                    if (sequence_parallel && tp == 1) continue;  // it splits over the tensor group
                    Config config = base;
                    config.grid.dp = dp;
                    config.grid.tp = tp;
                    config.grid.pp = pp;
                    config.grid.ep = ep;
                    config.strategies.get<ZeroOptions>() = zero;
                    config.strategies.get<PipelineOptions>() = pipeline;
                    config.data.micro_batches = micro_batches;
                    config.training.recompute = recompute;
                    config.strategies.get<TensorParallelOptions>().sequence_parallel = sequence_parallel;
                    config.device.offload = offload;
                    try {
                      validate_options(config, world);
                    } catch (const UsageError&) {
                      continue;
                    }
                    layouts.push_back(std::move(config));
                  }
    }
  }
  return layouts;
}

}  // namespace mlptrain
