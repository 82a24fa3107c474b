// The list of strategies. Adding a strategy is a new file defining its registration plus one line
// here; the order of the list means nothing (each registration declares how it composes).
#include "strategies/strategy.hpp"

namespace mlptrain {

extern const StrategyRegistration data_parallel_registration;
extern const StrategyRegistration zero_registration;
extern const StrategyRegistration tensor_parallel_registration;
extern const StrategyRegistration pipeline_registration;
extern const StrategyRegistration expert_parallel_registration;
extern const StrategyRegistration fp8_amax_agreement_registration;

std::span<const StrategyRegistration> strategy_registry() {
  static const StrategyRegistration registry[] = {
      data_parallel_registration,
      zero_registration,
      tensor_parallel_registration,
      pipeline_registration,
      expert_parallel_registration,
      fp8_amax_agreement_registration,
  };
  return registry;
}

std::string_view role_name(Role role) {
  switch (role) {
    case Role::reduces_gradients: return "sums gradients over replicas";
    case Role::owns_schedule: return "orders the step";
    case Role::shards_state: return "places the training state";
    case Role::exchanges_experts: return "connects MoE layers to their experts";
    case Role::splits_tensors: return "splits tensors";
    case Role::agrees_fp8_scales: return "agrees fp8 scales over replicas";
  }
  return "?";
}

bool exclusive(Role role) { return role != Role::splits_tensors; }

}  // namespace mlptrain
