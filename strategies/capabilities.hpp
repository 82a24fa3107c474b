// What a strategy's object can do for the loop: the capabilities it implements, and the roles
// that follow from them. A strategy's roles are read from its type (strategy_roles), never listed
// beside it:
//   LayerHooks        calls at fixed points around each layer and step (any number of strategies)
//   StageTransfers    moves tensors across stage boundaries (owns_schedule: one)
//   StateSharding     places the training state when it is sharded (shards_state: one)
//   ExpertExchange    connects MoE layers to their global micro-batch and experts (one)
//   ReducesGradients, SplitsTensors, AgreesFp8Scales: tags for what no capability shows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "comm/communicator.hpp"
#include "model/expert_exchange.hpp"
#include "model/fp8_linear.hpp"
#include "model/state_ranges.hpp"
#include "schedule/schedule.hpp"
#include "strategies/backward_views.hpp"
#include "strategies/forward_views.hpp"

namespace mlptrain {

// agree_operand_amax (--fp8): an fp8 operand's absolute maxima on this rank ([scales.count] fp32,
// in the kernels' memory), to be made those of the operand's whole population before its scale
// is formed (§2.7). Every rank holding part of the population calls it at the same point; a
// strategy whose split cuts through a scale's elements maximizes over its group.
struct OperandAmax : LayerCall {
  Fp8OperandScales scales;
  float* amax;
};

// A pipeline boundary: one micro-batch's tensor ([rows, features], this rank's local slice)
// leaving for or arriving from a neighbouring stage, as a send or receive action names it. The
// loop owns the memory and keeps it alive until the transfer is done (a failing run aborts).
// Activations and their gradients travel in the param type.
struct TransferEvent {
  ActionKind kind = ActionKind::send_activations;
  int micro_batch = 0;
  int chunk = 0;  // the stage's local model chunk whose input or output this is
  void* data = nullptr;
  std::size_t count = 0;
  DataType type = DataType::float32;
};

struct StepEvent {
  std::int64_t step = 0;  // 0-based index of the optimizer step being taken
};

// A strategy's object: owns what the strategy keeps; what it does is in what else it derives from.
class Strategy {
 public:
  virtual ~Strategy() = default;
};

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_step(const StepEvent&) {}
  virtual void before_layer_forward(ForwardStart&) {}
  virtual void after_layer_matmul(const ForwardProduct&) {}
  virtual void after_layer_forward(const ForwardDone&) {}
  // Backward hooks run for each part of a split backward (the view's part says which).
  virtual void before_layer_backward(BackwardStart&) {}
  virtual void before_layer_matmul_backward(const BackwardProduct&) {}
  virtual void after_layer_backward(const BackwardDone&) {}
  // Within a layer's fp8 products (forward or backward), before an operand is scaled.
  virtual void agree_operand_amax(const OperandAmax&) {}
  // After the last backward: every gradient must be final when this returns.
  virtual void synchronize_gradients(const StepEvent&) {}
  virtual void after_optimizer_step(const StepEvent&) {}
};

// The transfers the schedule's send and receive actions start: the transfer starts now, and the
// loop waits for the request before it touches the memory.
class StageTransfers {
 public:
  virtual ~StageTransfers() = default;
  virtual Request start_transfer(const TransferEvent& event) = 0;
};

// Where the rank's training state lives when it is sharded (else the store's runs are used).
class StateSharding {
 public:
  virtual ~StateSharding() = default;
  virtual StatePlacement state_placement() const = 0;
};

// Roles no capability shows, said by deriving from their tag.
struct ReducesGradients {};  // sums gradients over replicas
struct SplitsTensors {};     // narrows tensors to this rank's slices
struct AgreesFp8Scales {};   // makes fp8 operands' scales those of their whole population

// The roles a strategy plays. Exclusive roles have one owner per run; the others compose.
enum class Role {
  reduces_gradients,  // ReducesGradients (exclusive)
  owns_schedule,      // StageTransfers: splits the layers into stages and orders the step (exclusive)
  shards_state,       // StateSharding (exclusive)
  exchanges_experts,  // ExpertExchange (exclusive)
  splits_tensors,     // SplitsTensors (composes)
  agrees_fp8_scales,  // AgreesFp8Scales (exclusive)
};
std::string_view role_name(Role role);
bool exclusive(Role role);

// Each role and whether a strategy object of type S plays it.
template <typename S>
constexpr std::array<std::pair<Role, bool>, 6> role_table() {
  return {{{Role::reduces_gradients, std::is_base_of_v<ReducesGradients, S>},
           {Role::owns_schedule, std::is_base_of_v<StageTransfers, S>},
           {Role::shards_state, std::is_base_of_v<StateSharding, S>},
           {Role::exchanges_experts, std::is_base_of_v<ExpertExchange, S>},
           {Role::splits_tensors, std::is_base_of_v<SplitsTensors, S>},
           {Role::agrees_fp8_scales, std::is_base_of_v<AgreesFp8Scales, S>}}};
}

template <typename S>
constexpr std::size_t role_count() {
  std::size_t count = 0;
  for (const auto& [role, played] : role_table<S>()) count += played ? 1 : 0;
  return count;
}

// The roles of a strategy object of type S, as its type says.
template <typename S>
inline constexpr std::array<Role, role_count<S>()> strategy_roles = [] {
  std::array<Role, role_count<S>()> roles{};
  std::size_t next = 0;
  for (const auto& [role, played] : role_table<S>())
    if (played) roles[next++] = role;
  return roles;
}();

}  // namespace mlptrain
