// Builds the active strategies from the registry (see strategy_stack.hpp).
#include "train/strategy_stack.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace mlptrain {

StrategyStack::StrategyStack(const StrategyContext& context) {
  for (const StrategyRegistration& entry : strategy_registry())
    if (entry.wanted(context.config, context.groups.shape()))
      strategies_.push_back(entry.create(context));
}

ParameterPlan StrategyStack::plan(const Config& config, const GridShape& shape,
                                  const GridCoordinates& place) {
  ParameterPlan plan;
  for (const StrategyRegistration& entry : strategy_registry())
    if (entry.plan != nullptr && entry.wanted(config, shape)) entry.plan(config, shape, place, plan);
  return plan;
}

LayerRange StrategyStack::layers(const Config& config, const std::vector<LayerSpec>& model,
                                 const GridShape& shape, const GridCoordinates& place) {
  for (const StrategyRegistration& entry : strategy_registry())
    if (entry.layers != nullptr && entry.wanted(config, shape)) return entry.layers(model, shape, place);
  return {0, static_cast<int>(model.size())};
}

std::vector<Action> StrategyStack::schedule(int micro_batches, bool training) const {
  for (const auto& strategy : strategies_)
    if (auto actions = strategy->schedule(micro_batches, training)) return std::move(*actions);
  return training ? sequential_schedule(micro_batches) : forward_only_schedule(micro_batches);
}

Request StrategyStack::start_transfer(const TransferEvent& event) {
  for (const auto& strategy : strategies_)
    if (auto request = strategy->start_transfer(event)) return std::move(*request);
  throw std::logic_error(fmt::format("no strategy moves {} across a stage boundary",
                                     action_name(event.kind)));
}

ExpertExchange& StrategyStack::expert_exchange() {
  for (const auto& strategy : strategies_)
    if (ExpertExchange* exchange = strategy->expert_exchange()) return *exchange;
  return single_process_;
}

std::optional<StatePlacement> StrategyStack::state_placement() const {
  for (const auto& strategy : strategies_)
    if (auto placement = strategy->state_placement()) return placement;
  return std::nullopt;
}

std::vector<std::string> StrategyStack::notes() const {
  std::vector<std::string> notes;
  for (const auto& strategy : strategies_)
    if (auto note = strategy->note(); !note.empty()) notes.push_back(std::move(note));
  return notes;
}

std::vector<std::string_view> StrategyStack::names() const {
  std::vector<std::string_view> names;
  for (const auto& strategy : strategies_) names.push_back(strategy->name());
  return names;
}

}  // namespace mlptrain
