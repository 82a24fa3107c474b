// The list of strategies. Adding a strategy is a folder of its own defining its registration
// (registration.hpp), its sources in meson.build, and one line in this list; the list's order
// means nothing (each registration declares how it composes).
#include "strategies/registration.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#define MLPTRAIN_STRATEGIES(STRATEGY) \
  STRATEGY(data_parallel)             \
  STRATEGY(zero)                      \
  STRATEGY(tensor_parallel)           \
  STRATEGY(pipeline)                  \
  STRATEGY(expert_parallel)           \
  STRATEGY(fp8_amax_agreement)

namespace mlptrain {

#define MLPTRAIN_DECLARE(name) extern const StrategyRegistration name##_registration;
MLPTRAIN_STRATEGIES(MLPTRAIN_DECLARE)
#undef MLPTRAIN_DECLARE

std::span<const StrategyRegistration> strategy_registry() {
#define MLPTRAIN_ENTRY(name) name##_registration,
  static const StrategyRegistration registry[] = {MLPTRAIN_STRATEGIES(MLPTRAIN_ENTRY)};
#undef MLPTRAIN_ENTRY
  return registry;
}

std::vector<RunSetting> run_settings(const Config& config, const GridShape& shape) {
  std::vector<RunSetting> settings;
  for (const StrategyRegistration& strategy : strategy_registry())
    if (strategy.settings != nullptr) strategy.settings(config, shape, settings);
  return settings;
}

std::string layout_words(const GridShape& shape, const std::vector<RunSetting>& settings) {
  std::string words = fmt::format("dp={} tp={} pp={} ep={}", shape.dp, shape.tp, shape.pp, shape.ep);
  for (const RunSetting& setting : settings)
    if (setting.layout_word)
      words += std::visit([&](const auto& value) { return fmt::format(" {}={}", setting.name, value); }, setting.value);
  return words;
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
