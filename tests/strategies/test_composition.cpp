// How strategies compose, as their registrations declare it: which take part for a set of
// options (ZeRO replaces plain data parallelism), the hook order their declarations give
// whatever the registry's order, a refusal naming both strategies when two claim one exclusive
// role, and registrations that name an unknown strategy or an order with a cycle.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/error.hpp"
#include "train/rank_plan.hpp"

using namespace mlptrain;

namespace {

std::vector<std::string_view> names(const Strategies& strategies) {
  std::vector<std::string_view> result;
  for (const StrategyRegistration* entry : strategies) result.push_back(entry->name);
  return result;
}

std::vector<std::string_view> program_strategies(int dp, int tp, int pp, int zero) {
  Config config;
  config.zero = zero;
  return names(wanted_strategies(config, GridShape{.world = dp * tp * pp, .tp = tp, .dp = dp, .pp = pp}));
}

bool always(const Config&, const GridShape&) { return true; }
std::unique_ptr<Strategy> nothing(const StrategyContext&) { return nullptr; }

constexpr std::string_view after_alpha[] = {"alpha"};
constexpr std::string_view after_beta[] = {"beta"};
constexpr std::string_view unknown[] = {"gamma"};
constexpr Role schedule_role[] = {Role::owns_schedule};

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
      {.name = "beta", .runs_after = after_alpha, .wanted = always, .create = nothing},
      {.name = "delta", .wanted = always, .create = nothing},
      {.name = "alpha", .runs_after = {}, .wanted = always, .create = nothing},
  };
  EXPECT_EQ(names(compose_strategies(registry, Config{}, GridShape{})),
            (std::vector<std::string_view>{"alpha", "beta", "delta"}));
}

TEST(Composition, ConflictingExclusiveRolesAreRefused) {
  const StrategyRegistration registry[] = {
      {.name = "alpha", .roles = schedule_role, .wanted = always, .create = nothing},
      {.name = "beta", .roles = schedule_role, .wanted = always, .create = nothing},
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
      {.name = "alpha", .runs_after = after_beta, .wanted = always, .create = nothing},
      {.name = "beta", .runs_after = after_alpha, .wanted = always, .create = nothing},
  };
  EXPECT_THROW(compose_strategies(cycle, Config{}, GridShape{}), std::logic_error);
  const StrategyRegistration typo[] = {{.name = "alpha", .replaces = unknown, .wanted = always, .create = nothing}};
  EXPECT_THROW(compose_strategies(typo, Config{}, GridShape{}), std::logic_error);
}
