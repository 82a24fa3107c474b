// Builds the active strategies from the registry (see strategy_stack.hpp).
#include "train/strategy_stack.hpp"

namespace mlptrain {

StrategyStack::StrategyStack(const StrategyContext& context) {
  for (const StrategyRegistration& entry : strategy_registry())
    if (entry.wanted(context.config, context.groups.shape()))
      strategies_.push_back(entry.create(context));
}

std::vector<std::string_view> StrategyStack::names() const {
  std::vector<std::string_view> names;
  for (const auto& strategy : strategies_) names.push_back(strategy->name());
  return names;
}

}  // namespace mlptrain
