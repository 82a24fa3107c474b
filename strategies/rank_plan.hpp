// What the strategies make of a rank before anything is allocated, as pure functions of the
// configuration, the model and the rank's place in the grid: which strategies take part (their
// exclusive roles checked), the parameter plan, the layers the rank runs, a step's schedule, the
// rank's layout, and from that its predicted memory and communication and the sentences that
// describe the run. The trainer's summary and --predict ask these for the run being launched;
// the same calls answer for layouts that are never launched. Each takes the strategies that take
// part (the registry's wanted ones; tests pass their own).
#pragma once

#include <string>
#include <vector>

#include "cost/base_cost.hpp"
#include "cost/flops.hpp"
#include "cost/rank_layout.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

using Strategies = std::vector<const StrategyRegistration*>;

// The strategies of `registry` that take part, as their registrations declare: the wanted ones
// less those another wanted one replaces, their exclusive roles checked, in hook order.
Strategies compose_strategies(std::span<const StrategyRegistration> registry, const Config& config,
                              const GridShape& shape);
// compose_strategies over the program's registry.
Strategies wanted_strategies(const Config& config, const GridShape& shape);
// Throws UsageError when two of `strategies` claim one exclusive role.
void check_roles(const Strategies& strategies);

ParameterPlan parameter_plan(const Strategies& strategies, const Config& config, const GridShape& shape,
                             const GridCoordinates& place);
// The layers the rank runs: the chunks its pipeline gives it, else the whole model.
RankLayers rank_layers(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                       const GridShape& shape, const GridCoordinates& place);
// A step's actions for the rank (training) or an evaluation pass's (forwards only).
std::vector<Action> rank_schedule(const Strategies& strategies, const Config& config, const GridShape& shape,
                                  const GridCoordinates& place, int micro_batches, bool training);

RankLayout rank_layout(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                       const GridShape& shape, const GridCoordinates& place, LossKind loss_kind);

// The rank's memory by state and communication per step: the base terms, each strategy's, and
// the modes the options set.
Prediction predict_rank(const Strategies& strategies, const RankLayout& layout, const RoutingSeen& routing = {});

// The whole job's floating-point work of one training step (every stage's recomputation).
StepFlops step_flops(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                     const GridShape& shape);

// One sentence per strategy that has something to say about the run.
std::vector<std::string> strategy_notes(const Strategies& strategies, const RankLayout& layout);

}  // namespace mlptrain
