// The strategies' objects (see strategy_stack.hpp).
#include "strategies/strategy_stack.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace mlptrain {

StrategyStack::StrategyStack(const StrategyContext& context,
                             const std::vector<const StrategyRegistration*>& strategies) {
  for (const StrategyRegistration* entry : strategies) {
    StrategyObject object = entry->create(context);
    names_.push_back(entry->name);
    if (object.hooks != nullptr) hooks_.push_back(object.hooks);
    // One owner each, as composition checked when the strategies were chosen (rank_plan.hpp).
    if (object.transfers != nullptr) transfers_ = object.transfers;
    if (object.sharding != nullptr) sharding_ = object.sharding;
    if (object.exchange != nullptr) exchange_ = object.exchange;
    strategies_.push_back(std::move(object.owner));
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
