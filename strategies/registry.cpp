// The list of strategies. Adding a strategy is a new file defining its registration plus one line
// here; hooks run in this order.
#include "strategies/strategy.hpp"

namespace mlptrain {

extern const StrategyRegistration data_parallel_registration;
extern const StrategyRegistration zero_registration;
extern const StrategyRegistration tensor_parallel_registration;
extern const StrategyRegistration pipeline_registration;
extern const StrategyRegistration expert_parallel_registration;

std::span<const StrategyRegistration> strategy_registry() {
  static const StrategyRegistration registry[] = {
      data_parallel_registration,
      zero_registration,
      tensor_parallel_registration,
      pipeline_registration,
      expert_parallel_registration,
  };
  return registry;
}

}  // namespace mlptrain
