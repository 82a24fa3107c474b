// The strategies' pure answers for a rank (see rank_plan.hpp).
#include "strategies/rank_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"

namespace mlptrain {

namespace {

// The strategy that plays `role`, if one does.
const StrategyRegistration* owner(const Strategies& strategies, Role role) {
  for (const StrategyRegistration* entry : strategies)
    if (std::ranges::find(entry->roles(), role) != entry->roles().end()) return entry;
  return nullptr;
}

bool names(std::span<const std::string_view> list, std::string_view name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// Registrations that name a strategy the registry lacks, or an order with a cycle, are errors of
// the program, not of the user's options.
void check_names(std::span<const StrategyRegistration> registry) {
  for (const StrategyRegistration& entry : registry)
    for (const auto list : {entry.replaces, entry.runs_after})
      for (std::string_view name : list)
        if (std::none_of(registry.begin(), registry.end(), [&](const auto& other) { return other.name == name; }))
          throw std::logic_error(fmt::format("strategy {} names an unknown strategy {}", entry.name, name));
}

// The taking part in hook order: each after those it runs after, ties by name.
Strategies ordered(Strategies remaining) {
  std::sort(remaining.begin(), remaining.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  Strategies order;
  while (!remaining.empty()) {
    const auto ready = std::find_if(remaining.begin(), remaining.end(), [&](const StrategyRegistration* entry) {
      return std::none_of(remaining.begin(), remaining.end(),
                          [&](const StrategyRegistration* other) { return names(entry->runs_after, other->name); });
    });
    if (ready == remaining.end()) throw std::logic_error("the strategies' declared hook order has a cycle");
    order.push_back(*ready);
    remaining.erase(ready);
  }
  return order;
}

}  // namespace

Strategies compose_strategies(std::span<const StrategyRegistration> registry, const Config& config,
                              const GridShape& shape) {
  check_names(registry);
  Strategies wanted;
  for (const StrategyRegistration& entry : registry)
    if (entry.wanted(config, shape)) wanted.push_back(&entry);
  Strategies taking_part;
  for (const StrategyRegistration* entry : wanted)
    if (std::none_of(wanted.begin(), wanted.end(),
                     [&](const StrategyRegistration* other) { return names(other->replaces, entry->name); }))
      taking_part.push_back(entry);
  check_roles(taking_part);
  return ordered(std::move(taking_part));
}

Strategies wanted_strategies(const Config& config, const GridShape& shape) {
  return compose_strategies(strategy_registry(), config, shape);
}

void check_roles(const Strategies& strategies) {
  for (const StrategyRegistration* entry : strategies)
    for (Role role : entry->roles())
      for (const StrategyRegistration* other : strategies)
        if (other != entry && exclusive(role) &&
            std::ranges::find(other->roles(), role) != other->roles().end())
          throw UsageError(fmt::format("{} and {} cannot run together: each {}", entry->name, other->name,
                                       role_name(role)));
}

ParameterPlan parameter_plan(const Strategies& strategies, const Config& config, const GridShape& shape,
                             const GridCoordinates& place) {
  ParameterPlan plan;
  for (const StrategyRegistration* entry : strategies)
    if (entry->plan != nullptr) entry->plan(config, shape, place, plan);
  return plan;
}

RankLayers rank_layers(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                       const GridShape& shape, const GridCoordinates& place) {
  const StrategyRegistration* stages = owner(strategies, Role::owns_schedule);
  if (stages != nullptr) return stages->layers(config, model, shape, place);
  return RankLayers{.chunks = {{0, static_cast<int>(model.size())}}};
}

std::vector<Action> rank_schedule(const Strategies& strategies, const Config& config, const GridShape& shape,
                                  const GridCoordinates& place, int micro_batches, bool training) {
  const StrategyRegistration* stages = owner(strategies, Role::owns_schedule);
  if (stages != nullptr) return stages->schedule(config, shape, place, micro_batches, training);
  return training ? sequential_schedule(micro_batches) : forward_only_schedule(micro_batches);
}

RankLayout rank_layout(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                       const GridShape& shape, const GridCoordinates& place, LossKind loss_kind) {
  RankLayout layout{.config = config,
                    .model = model,
                    .shape = shape,
                    .place = place,
                    .layers = rank_layers(strategies, config, model, shape, place),
                    .plan = parameter_plan(strategies, config, shape, place),
                    .rows = config.data.global_batch / config.data.micro_batches / shape.dp,
                    .loss_kind = loss_kind,
                    .schedule = rank_schedule(strategies, config, shape, place, config.data.micro_batches, true)};
  layout.tensors = model_parameter_tensors(model, layout.layers.list(), layout.plan);
  layout.output_rows.assign(static_cast<std::size_t>(layout.local_layer_count()), layout.rows);
  for (const StrategyRegistration* entry : strategies)
    if (entry->split_rows != nullptr) entry->split_rows(layout, layout.output_rows);
  return layout;
}

Prediction predict_rank(const Strategies& strategies, const RankLayout& layout, const RoutingSeen& routing) {
  Prediction prediction = base_prediction(layout, routing);
  for (const StrategyRegistration* entry : strategies)
    if (entry->predict != nullptr) entry->predict(layout, prediction);
  finish_prediction(layout, prediction);
  return prediction;
}

StepFlops step_flops(const Strategies& strategies, const Config& config, const std::vector<LayerSpec>& model,
                     const GridShape& shape) {
  const auto samples = static_cast<double>(config.data.global_batch);
  StepFlops flops{.model = model_flops_per_sample(model) * samples};
  for (int stage = 0; stage < shape.pp; ++stage) {
    for (const LayerRange& chunk : rank_layers(strategies, config, model, shape, {.pp = stage}).chunks) {
      const std::vector<LayerSpec> chunk_layers(model.begin() + chunk.first, model.begin() + chunk.last);
      flops.recompute += recompute_flops_per_sample(chunk_layers, config.training.recompute) * samples;
    }
  }
  return flops;
}

std::vector<std::string> strategy_notes(const Strategies& strategies, const RankLayout& layout) {
  std::vector<std::string> notes;
  for (const StrategyRegistration* entry : strategies)
    if (entry->describe != nullptr) notes.push_back(entry->describe(layout));
  return notes;
}

}  // namespace mlptrain
