// The hook interface through which parallel strategies plug into the common training loop. The
// loop calls every active strategy at fixed points of a step, in registration order; a strategy
// composes with others by acting only on its own process group and its own part of the state.
// The loop knows strategies only through this header.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/comm_ledger.hpp"
#include "comm/process_groups.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "kernels/kernels.hpp"
#include "model/linear.hpp"
#include "model/model_spec.hpp"
#include "model/moe.hpp"
#include "model/parameter_store.hpp"
#include "model/state_runs.hpp"
#include "strategies/schedule.hpp"

namespace mlptrain {

// What a strategy may use; everything is owned by the trainer and outlives the strategies.
struct StrategyContext {
  const Config& config;
  const ProcessGroups& groups;
  Kernels& kernels;
  Allocator& allocator;
  ParameterStore& parameters;
  const std::vector<LayerSpec>& layers;  // the whole model
  int first_layer = 0;                   // this rank's layers are [first_layer, last_layer)
  int last_layer = 0;
};

// One layer of one micro-batch. Pointers are this rank's local tensors ([rows, features]); those
// not yet computed at the hook's point are null. `parameters` is the layer's view of its weights,
// bias and their gradients: a before-hook may point it elsewhere for this use (a gathered copy of
// sharded parameters, a transient gradient buffer), and may make the gradients overwrite instead
// of accumulate.
struct LayerEvent {
  int layer = 0;
  int micro_batch = 0;
  int micro_batches = 1;
  bool training = true;  // false while evaluating
  // A forward run again in backward (--recompute) for activations the first forward dropped:
  // the same computation, so the same hooks, but the layer's backward follows right after.
  bool recomputing = false;
  std::int64_t rows = 0;
  LinearLayer* parameters = nullptr;
  bool accumulate_grads = false;  // add into the gradients (later micro-batches) or overwrite
  const float* input = nullptr;
  float* pre = nullptr;           // x W^T, then + b
  float* output = nullptr;        // the layer's output (GELU(pre) or pre); forward only
  const float* grad_output = nullptr;
  float* grad_input = nullptr;    // null for the model's first layer
  bool last_micro_batch() const { return micro_batch == micro_batches - 1; }
};

// A pipeline boundary: one micro-batch's tensor ([rows, features], this rank's local slice)
// leaving for or arriving from a neighbouring stage, as a send or receive action names it. The
// loop owns the memory and keeps it alive until the transfer is done (a failing run aborts).
struct TransferEvent {
  ActionKind kind = ActionKind::send_activations;
  int micro_batch = 0;
  float* data = nullptr;
  std::size_t floats = 0;
};

struct StepEvent {
  std::int64_t step = 0;  // 0-based index of the optimizer step being taken
};

// A prediction of this rank's memory by state and communication per step (DESIGN.md §2.4). The
// trainer fills in what follows from the model and batch; strategies adjust it for what they do.
inline constexpr std::array<MemoryState, 4> placement_states = {
    MemoryState::params, MemoryState::grads, MemoryState::optimizer, MemoryState::activations};

struct PlacementPrediction {
  std::array<std::string, 4> modes = {"R", "R", "R", "R"};  // per placement_states entry
  std::array<std::int64_t, 4> bytes{};
  std::array<std::int64_t, comm_op_count> comm_bytes_per_step{};

  std::int64_t& comm(CommOp op) { return comm_bytes_per_step[static_cast<int>(op)]; }
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;

  virtual void before_step(const StepEvent&) {}
  virtual void before_layer_forward(LayerEvent&) {}
  // Between the matrix product and bias/activation: pre holds x W^T.
  virtual void after_layer_matmul(LayerEvent&) {}
  virtual void after_layer_forward(LayerEvent&) {}
  virtual void before_layer_backward(LayerEvent&) {}
  // The layer's parameter gradients for this micro-batch are complete.
  virtual void after_layer_backward(LayerEvent&) {}
  // After the last backward: every gradient must be final when this returns.
  virtual void synchronize_gradients(const StepEvent&) {}
  virtual void after_optimizer_step(const StepEvent&) {}

  // The strategy that splits the model into stages orders a step's work (else one micro-batch's
  // forward and backward after the other) and moves data across its boundaries: the transfer
  // starts now, and the loop waits for the request before it touches the memory.
  virtual std::optional<std::vector<Action>> schedule(int /*micro_batches*/, bool /*training*/) const {
    return std::nullopt;
  }
  virtual std::optional<Request> start_transfer(const TransferEvent&) { return std::nullopt; }

  // The strategy that spreads a global micro-batch or the experts over ranks connects MoE
  // layers to them (else each rank's micro-batch is the global one and it holds every expert).
  virtual ExpertExchange* expert_exchange() { return nullptr; }

  virtual void predict(PlacementPrediction&) const {}
  // Where the rank's state lives when the strategy shards it (else the store's runs are used).
  virtual std::optional<StatePlacement> state_placement() const { return std::nullopt; }
  // A sentence for the start of the run, if the strategy has something to say.
  virtual std::string note() const { return {}; }
};

// A strategy's entry in the registry: when it takes part, how it wants parameter memory laid out
// and which layers this rank runs (both optional, and called before the parameter store
// exists), and how to make it.
struct StrategyRegistration {
  std::string_view name;
  bool (*wanted)(const Config& config, const GridShape& shape);
  std::unique_ptr<Strategy> (*create)(const StrategyContext& context);
  void (*plan)(const Config& config, const GridShape& shape, const GridCoordinates& place,
               ParameterPlan& plan) = nullptr;
  LayerRange (*layers)(const std::vector<LayerSpec>& model, const GridShape& shape,
                       const GridCoordinates& place) = nullptr;
};

// Every strategy, in the order their hooks run.
std::span<const StrategyRegistration> strategy_registry();

}  // namespace mlptrain
