// The active strategies of a run, built from the registry, with each hook forwarded to every one
// of them in registration order. This is all the loop sees of parallelism.
#pragma once

#include <memory>
#include <vector>

#include "strategies/strategy.hpp"

namespace mlptrain {

class StrategyStack {
 public:
  explicit StrategyStack(const StrategyContext& context);

  std::vector<std::string_view> names() const;
  void before_step(const StepEvent& event) { each([&](Strategy& s) { s.before_step(event); }); }
  void before_layer_forward(LayerEvent& event) {
    each([&](Strategy& s) { s.before_layer_forward(event); });
  }
  void after_layer_matmul(LayerEvent& event) {
    each([&](Strategy& s) { s.after_layer_matmul(event); });
  }
  void after_layer_forward(LayerEvent& event) {
    each([&](Strategy& s) { s.after_layer_forward(event); });
  }
  void before_layer_backward(LayerEvent& event) {
    each([&](Strategy& s) { s.before_layer_backward(event); });
  }
  void after_layer_backward(LayerEvent& event) {
    each([&](Strategy& s) { s.after_layer_backward(event); });
  }
  void synchronize_gradients(const StepEvent& event) {
    each([&](Strategy& s) { s.synchronize_gradients(event); });
  }
  void after_optimizer_step(const StepEvent& event) {
    each([&](Strategy& s) { s.after_optimizer_step(event); });
  }
  // The step's actions: the first strategy's that orders them, else the sequential ones.
  std::vector<Action> schedule(int micro_batches, bool training) const;
  // Starts a boundary transfer through the strategy that handles it.
  Request start_transfer(const TransferEvent& event);
  // Where MoE layers meet the rest of their micro-batch and their experts.
  ExpertExchange& expert_exchange();
  void predict(PlacementPrediction& prediction) const {
    for (const auto& strategy : strategies_) strategy->predict(prediction);
  }
  // The first strategy's placement of the state, if one shards it.
  std::optional<StatePlacement> state_placement() const;
  std::vector<std::string> notes() const;

  // The parameter layout the wanted strategies ask for (before any exists).
  static ParameterPlan plan(const Config& config, const GridShape& shape,
                            const GridCoordinates& place);
  // The layers this rank runs: the first wanted strategy's choice, else the whole model.
  static LayerRange layers(const Config& config, const std::vector<LayerSpec>& model,
                           const GridShape& shape, const GridCoordinates& place);

 private:
  template <typename Call>
  void each(Call&& call) {
    for (auto& strategy : strategies_) call(*strategy);
  }
  std::vector<std::unique_ptr<Strategy>> strategies_;
  SingleProcessExchange single_process_;
};

}  // namespace mlptrain
