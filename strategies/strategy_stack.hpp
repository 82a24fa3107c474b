// The objects of the strategies that take part in a run (strategies/rank_plan.hpp says which, or a
// test gives its own), made once the parameters exist, and what the loop asks of them: every
// layer and step hook forwarded to each strategy with hooks, in the order their registrations
// declare (compose_strategies), and the one owner of each exclusive role asked for its part
// (stage transfers, the sharded state's placement, the MoE exchange). This is all the loop sees
// of parallelism.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "strategies/registration.hpp"

namespace mlptrain {

class StrategyStack {
 public:
  StrategyStack(const StrategyContext& context, const std::vector<const StrategyRegistration*>& strategies);

  const std::vector<std::string_view>& names() const { return names_; }
  // The object of the strategy named `name` (tests look into their own strategies through it).
  Strategy& object(std::string_view name) const;
  void before_step(const StepEvent& event) { each([&](LayerHooks& s) { s.before_step(event); }); }
  void before_layer_forward(ForwardStart& event) {
    each([&](LayerHooks& s) { s.before_layer_forward(event); });
  }
  void after_layer_matmul(const ForwardProduct& event) {
    each([&](LayerHooks& s) { s.after_layer_matmul(event); });
  }
  void after_layer_forward(const ForwardDone& event) {
    each([&](LayerHooks& s) { s.after_layer_forward(event); });
  }
  void before_layer_backward(BackwardStart& event) {
    each([&](LayerHooks& s) { s.before_layer_backward(event); });
  }
  void before_layer_matmul_backward(const BackwardProduct& event) {
    each([&](LayerHooks& s) { s.before_layer_matmul_backward(event); });
  }
  void after_layer_backward(const BackwardDone& event) {
    each([&](LayerHooks& s) { s.after_layer_backward(event); });
  }
  void agree_operand_amax(const OperandAmax& event) {
    each([&](LayerHooks& s) { s.agree_operand_amax(event); });
  }
  void synchronize_gradients(const StepEvent& event) {
    each([&](LayerHooks& s) { s.synchronize_gradients(event); });
  }
  void after_optimizer_step(const StepEvent& event) {
    each([&](LayerHooks& s) { s.after_optimizer_step(event); });
  }
  // Starts a boundary transfer through the strategy that owns the schedule.
  Request start_transfer(const TransferEvent& event);
  // Where MoE layers meet the rest of their micro-batch and their experts (one process: itself).
  ExpertExchange& expert_exchange() { return exchange_ != nullptr ? *exchange_ : single_process_; }
  // The placement of the state, when a strategy shards it.
  std::optional<StatePlacement> state_placement() const;

 private:
  template <typename Call>
  void each(Call&& call) {
    for (LayerHooks* hooks : hooks_) call(*hooks);
  }
  std::vector<std::unique_ptr<Strategy>> strategies_;
  std::vector<std::string_view> names_;
  std::vector<LayerHooks*> hooks_;
  StageTransfers* transfers_ = nullptr;
  StateSharding* sharding_ = nullptr;
  ExpertExchange* exchange_ = nullptr;
  SingleProcessExchange single_process_;
};

}  // namespace mlptrain
