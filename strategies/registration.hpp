// How a strategy joins the program: what it declares (its name, how it composes, its options and
// their rules, when it takes part, and pure functions the run and the planner ask before anything
// is allocated), registered with the type of the object a run makes of it once the parameters
// exist. The registration reads that type: its roles (capabilities.hpp) and the capabilities the
// loop reaches it by, checked by the compiler, so nothing is said twice or looked up at run time.
// Adding a strategy is a folder of its own, one line in registry.cpp and one in meson.build.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "comm/process_groups.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "cost/prediction.hpp"
#include "cost/rank_layout.hpp"
#include "kernels/kernels.hpp"
#include "model/parameter_store.hpp"
#include "strategies/capabilities.hpp"
#include "strategies/strategy_command_line.hpp"

namespace mlptrain {

// What a strategy object may use; everything is owned by the run and outlives the strategies.
struct StrategyContext {
  const Config& config;
  const ProcessGroups& groups;
  Kernels& kernels;
  Allocator& allocator;
  ParameterStore& parameters;
  const std::vector<LayerSpec>& layers;  // the whole model
  RankLayers local;                      // this rank's layers
};

// A strategy's object, and the capabilities the loop reaches it by (null: it has not that one).
struct StrategyObject {
  std::unique_ptr<Strategy> owner;
  LayerHooks* hooks = nullptr;
  StageTransfers* transfers = nullptr;
  StateSharding* sharding = nullptr;
  ExpertExchange* exchange = nullptr;
};

// One of a strategy's settings as a run's records name it (the run's first line, a checkpoint's
// layout, the trace).
struct RunSetting {
  std::string_view name;
  std::variant<std::int64_t, double, std::string, std::vector<std::vector<std::int64_t>>> value;
  bool layout_word = false;  // also a word of the layout beside dp, tp, pp and ep ("zero=1")
};

// What a strategy says of itself.
struct StrategyDeclaration {
  std::string_view name;
  // Composition, declared rather than implied by the registry's order. `replaces`: strategies
  // whose work this one does itself; when both are wanted only this one takes part (ZeRO sums
  // gradients over the data-parallel group, so plain data parallelism steps aside). `runs_after`:
  // strategies whose hooks run before this one's at every hook point when both take part.
  // Strategies with no declared order between them must not depend on one: their hooks run in
  // the order of their names.
  std::span<const std::string_view> replaces{};
  std::span<const std::string_view> runs_after{};
  // The options the strategy owns (strategy_command_line.hpp), and its rules on the configuration
  // once dp is known: it throws UsageError naming the offending option. Called for every
  // registration, wanted or not.
  std::span<const Option> options{};
  void (*validate)(const Config& config) = nullptr;
  bool (*wanted)(const Config& config, const GridShape& shape) = nullptr;
  // Pure, called before any memory exists (the planner calls them for layouts it never runs).
  void (*plan)(const Config& config, const GridShape& shape, const GridCoordinates& place,
               ParameterPlan& plan) = nullptr;
  RankLayers (*layers)(const Config& config, const std::vector<LayerSpec>& model, const GridShape& shape,
                       const GridCoordinates& place) = nullptr;
  std::vector<Action> (*schedule)(const Config& config, const GridShape& shape,
                                  const GridCoordinates& place, int micro_batches, bool training) = nullptr;
  // The rows of each of the rank's layers' outputs in a training micro-batch (one entry per
  // local layer, the micro-batch's rows unless a strategy splits them): what its hooks will make
  // of them, for the cost model.
  void (*split_rows)(const RankLayout& layout, std::vector<std::int64_t>& output_rows) = nullptr;
  // Adds the strategy's closed-form terms to a rank's prediction.
  void (*predict)(const RankLayout& layout, Prediction& prediction) = nullptr;
  // A sentence for the start of the run.
  std::string (*describe)(const RankLayout& layout) = nullptr;
  // The grid as the strategy shapes it beyond its degrees (ZeRO's shard groups), before any group
  // is made; and its settings in a run's records. Both asked of every registration, whether it
  // takes part or not, so that every grid and every record of a run are alike.
  void (*shape)(const Config& config, GridShape& shape) = nullptr;
  void (*settings)(const Config& config, const GridShape& shape, std::vector<RunSetting>& settings) = nullptr;
};

// A strategy object's type: made from the context, a Strategy.
template <typename S>
concept StrategyType = std::derived_from<S, Strategy> && std::constructible_from<S, const StrategyContext&>;

// A declaration with the roles and the making of its object's type: only register_strategy
// makes one, so the two cannot disagree.
class StrategyRegistration : public StrategyDeclaration {
 public:
  std::span<const Role> roles() const { return roles_; }
  StrategyObject create(const StrategyContext& context) const { return create_(context); }

 private:
  template <StrategyType S>
  friend constexpr StrategyRegistration register_strategy(const StrategyDeclaration& declaration);
  constexpr StrategyRegistration(const StrategyDeclaration& declaration, std::span<const Role> roles,
                                 StrategyObject (*create)(const StrategyContext&))
      : StrategyDeclaration(declaration), roles_(roles), create_(create) {}
  std::span<const Role> roles_;
  StrategyObject (*create_)(const StrategyContext&);
};

template <StrategyType S>
constexpr StrategyRegistration register_strategy(const StrategyDeclaration& declaration) {
  return StrategyRegistration(declaration, strategy_roles<S>, [](const StrategyContext& context) {
    auto made = std::make_unique<S>(context);
    StrategyObject object;
    if constexpr (std::derived_from<S, LayerHooks>) object.hooks = made.get();
    if constexpr (std::derived_from<S, StageTransfers>) object.transfers = made.get();
    if constexpr (std::derived_from<S, StateSharding>) object.sharding = made.get();
    if constexpr (std::derived_from<S, ExpertExchange>) object.exchange = made.get();
    object.owner = std::move(made);
    return object;
  });
}

// Every strategy (in no meaningful order: see StrategyDeclaration for how they compose).
std::span<const StrategyRegistration> strategy_registry();

// Every registration's settings, in the registry's order.
std::vector<RunSetting> run_settings(const Config& config, const GridShape& shape);
// The layout in words: "dp=2 tp=1 pp=1 ep=1" and the settings that are layout words.
std::string layout_words(const GridShape& shape, const std::vector<RunSetting>& settings);

}  // namespace mlptrain
