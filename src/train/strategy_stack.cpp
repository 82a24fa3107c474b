// The strategies' objects (see strategy_stack.hpp).
#include "train/strategy_stack.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>


namespace mlptrain {

namespace {

// The object's capability for `role`: present exactly when the registration declares the role.
template <typename Capability>
Capability* capability(Strategy& strategy, const StrategyRegistration& entry, Role role) {
  auto* found = dynamic_cast<Capability*>(&strategy);
  const bool declared = std::find(entry.roles.begin(), entry.roles.end(), role) != entry.roles.end();
  if ((found != nullptr) != declared)
    throw std::logic_error(fmt::format("strategy {} {} the role '{}' but {} what it needs", entry.name,
                                       declared ? "declares" : "does not declare", role_name(role),
                                       found != nullptr ? "implements" : "does not implement"));
  return found;
}

}  // namespace

StrategyStack::StrategyStack(const StrategyContext& context,
                             const std::vector<const StrategyRegistration*>& strategies) {
  for (const StrategyRegistration* entry : strategies) {
    std::unique_ptr<Strategy> strategy = entry->create(context);
    names_.push_back(entry->name);
    if (auto* hooks = dynamic_cast<LayerHooks*>(strategy.get())) hooks_.push_back(hooks);
    if (auto* found = capability<StageTransfers>(*strategy, *entry, Role::owns_schedule)) transfers_ = found;
    if (auto* found = capability<StateSharding>(*strategy, *entry, Role::shards_state)) sharding_ = found;
    if (auto* found = capability<ExpertExchange>(*strategy, *entry, Role::exchanges_experts)) exchange_ = found;
    strategies_.push_back(std::move(strategy));
  }
}

Strategy& StrategyStack::object(std::string_view name) const {
  for (std::size_t index = 0; index < names_.size(); ++index)
    if (names_[index] == name) return *strategies_[index];
  throw std::out_of_range(fmt::format("no strategy {} takes part", name));
}

Request StrategyStack::start_transfer(const TransferEvent& event) {
  if (transfers_ == nullptr)
    throw std::logic_error(fmt::format("no strategy moves {} across a stage boundary", action_name(event.kind)));
  return transfers_->start_transfer(event);
}

std::optional<StatePlacement> StrategyStack::state_placement() const {
  if (sharding_ == nullptr) return std::nullopt;
  return sharding_->state_placement();
}

}  // namespace mlptrain
