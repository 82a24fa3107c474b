// How strategies compose, as their registrations declare it: which take part for a set of
// options (ZeRO replaces plain data parallelism), the hook and split order their declarations
// give whatever the registry's order (tensor parallelism narrows expert parallelism's block of
// experts), placement modes that do not depend on that order, a refusal naming both strategies
// when two claim one exclusive role, and registrations that name an unknown strategy or an order
// with a cycle.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"
#include "strategies/rank_plan.hpp"
#include "strategies/zero/zero_options.hpp"

using namespace mlptrain;

namespace {

std::vector<std::string_view> names(const Strategies& strategies) {
  std::vector<std::string_view> result;
  for (const StrategyRegistration* entry : strategies) result.push_back(entry->name);
  return result;
}

std::vector<std::string_view> program_strategies(int dp, int tp, int pp, int zero) {
  Config config;
  config.strategies.get<ZeroOptions>().stage = zero;
  return names(wanted_strategies(config, GridShape{.world = dp * tp * pp, .tp = tp, .dp = dp, .pp = pp}));
}

// A small model of 4 layers (an MoE layer at 2 when `moe`) at dp x tp x pp.
struct SmallRun {
  Config config;
  GridShape shape;
  std::vector<LayerSpec> model;
  Strategies strategies;

  SmallRun(int dp, int tp, int pp, int zero, bool moe = false, int ep = 1) {
    config.model.layers = 4;
    config.model.hidden = 16;
    config.model.input_dim = 8;
    config.model.output_dim = 4;
    config.data.global_batch = 16;
    config.data.micro_batches = 2;
    config.strategies.get<ZeroOptions>().stage = zero;
    config.grid.dp = dp, config.grid.tp = tp, config.grid.pp = pp, config.grid.ep = ep;
    if (moe) config.model.moe_every = 2, config.model.experts = 8, config.model.top_k = 2;
    shape = {.world = dp * tp * pp, .tp = tp, .dp = dp, .pp = pp, .ep = ep};
    model = model_layer_specs(config.model.layers, config.model.input_dim, config.model.hidden, config.model.output_dim, config.model.moe_every,
                              config.model.experts, config.model.top_k);
    strategies = wanted_strategies(config, shape);
  }
  RankLayout layout(const GridCoordinates& place) const {
    return rank_layout(strategies, config, model, shape, place, LossKind::mse);
  }
};

bool always(const Config&, const GridShape&) { return true; }

// Strategies that are only their declarations, and one that orders the step (its role follows
// from the capability it implements).
struct Inert final : Strategy {
  explicit Inert(const StrategyContext&) {}
};
struct Scheduler final : Strategy, StageTransfers {
  explicit Scheduler(const StrategyContext&) {}
  Request start_transfer(const TransferEvent&) override { return {}; }
};
StrategyRegistration inert(const StrategyDeclaration& declaration) { return register_strategy<Inert>(declaration); }

constexpr std::string_view after_alpha[] = {"alpha"};
constexpr std::string_view after_beta[] = {"beta"};
constexpr std::string_view unknown[] = {"gamma"};

}  // namespace

TEST(Composition, ProgramRegistry) {
  EXPECT_EQ(program_strategies(1, 1, 1, 0), std::vector<std::string_view>{});
  EXPECT_EQ(program_strategies(2, 1, 1, 0), std::vector<std::string_view>{"data_parallel"});
  // ZeRO does data parallelism's reduction itself: only one of them sums gradients.
  EXPECT_EQ(program_strategies(2, 1, 1, 2), std::vector<std::string_view>{"zero"});
  // Tensor parallelism's hooks follow the gradient reductions' (declared), whatever the names say.
  EXPECT_EQ(program_strategies(2, 2, 1, 0), (std::vector<std::string_view>{"data_parallel", "tensor_parallel"}));
  EXPECT_EQ(program_strategies(2, 2, 2, 3), (std::vector<std::string_view>{"pipeline", "zero", "tensor_parallel"}));
}

TEST(Composition, DeclaredOrderNotRegistryOrder) {
  // beta runs after alpha, though listed first and named later; delta has no order and sorts by name.
  const StrategyRegistration registry[] = {
      inert({.name = "beta", .runs_after = after_alpha, .wanted = always}),
      inert({.name = "delta", .wanted = always}),
      inert({.name = "alpha", .runs_after = {}, .wanted = always}),
  };
  EXPECT_EQ(names(compose_strategies(registry, Config{}, GridShape{})),
            (std::vector<std::string_view>{"alpha", "beta", "delta"}));
}

TEST(Composition, ConflictingExclusiveRolesAreRefused) {
  const StrategyRegistration registry[] = {
      register_strategy<Scheduler>({.name = "alpha", .wanted = always}),
      register_strategy<Scheduler>({.name = "beta", .wanted = always}),
  };
  try {
    compose_strategies(registry, Config{}, GridShape{});
    FAIL() << "two owners of the schedule were accepted";
  } catch (const UsageError& error) {
    EXPECT_EQ(std::string(error.what()), "alpha and beta cannot run together: each orders the step");
  }
}

TEST(Composition, BrokenDeclarations) {
  const StrategyRegistration cycle[] = {
      inert({.name = "alpha", .runs_after = after_beta, .wanted = always}),
      inert({.name = "beta", .runs_after = after_alpha, .wanted = always}),
  };
  EXPECT_THROW(compose_strategies(cycle, Config{}, GridShape{}), std::logic_error);
  const StrategyRegistration typo[] = {inert({.name = "alpha", .replaces = unknown, .wanted = always})};
  EXPECT_THROW(compose_strategies(typo, Config{}, GridShape{}), std::logic_error);
}

TEST(Composition, TensorSlicesNarrowTheExpertBlock) {
  const SmallRun run(2, 2, 1, 0, true, 2);
  EXPECT_EQ(names(run.strategies), (std::vector<std::string_view>{"data_parallel", "expert_parallel", "tensor_parallel"}));
  // Expert rank 1 holds experts [4, 8); its tensor rank 0 the first half of them.
  const RankLayout layout = run.layout({.tp = 0, .dp = 1, .ep = 1});
  const auto experts = std::find_if(layout.tensors.begin(), layout.tensors.end(), [](const ParameterTensor& tensor) {
    return tensor.path == "layers/02/experts/weight";
  });
  ASSERT_NE(experts, layout.tensors.end());
  EXPECT_EQ(experts->local_start[0], 4);
  EXPECT_EQ(experts->local_shape[0], 2);
}

TEST(Composition, PlacementModesDoNotDependOnPredictionOrder) {
  // ZeRO-1 inside a pipeline stage: the stage's parameters are its own (sharded), not replicated.
  const SmallRun pipeline(2, 1, 2, 1);
  EXPECT_EQ(predict_rank(pipeline.strategies, pipeline.layout({})).params.mode, PlacementMode::sharded);
  // ZeRO-3 over tensor slices: gathered shards, whichever strategy predicts last.
  const SmallRun slices(2, 2, 1, 3);
  EXPECT_EQ(predict_rank(slices.strategies, slices.layout({})).params.mode, PlacementMode::sharded_gathered);
  EXPECT_EQ(predict_rank(slices.strategies, slices.layout({})).grads.mode, PlacementMode::sharded);
}
