// How a parallel strategy plugs into the common training loop. A strategy is a registration (what
// it is called, its options and their rules, when it takes part, the roles it plays, and pure
// functions the run asks before anything is allocated: the parameter layout, the layers a rank runs, its terms of the cost model
// and a sentence for the start of the run) plus an object made once the parameters exist, which
// implements the capabilities its roles need:
//   LayerHooks      calls at fixed points around each layer and step (any number of strategies)
//   StageTransfers  moves tensors across stage boundaries, as the schedule says (one)
//   StateSharding   places the training state when it is sharded (one)
//   ExpertExchange  connects MoE layers to their global micro-batch and experts (one)
// The loop knows strategies only through this header and the stack (train/strategy_stack.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/process_groups.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "cost/prediction.hpp"
#include "cost/rank_layout.hpp"
#include "kernels/kernels.hpp"
#include "model/linear.hpp"
#include "model/model_spec.hpp"
#include "model/moe.hpp"
#include "model/parameter_store.hpp"
#include "model/state_runs.hpp"
#include "schedule/schedule.hpp"
#include "strategies/strategy_options.hpp"

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

// Which part of a layer's backward an event is: all of it, or (a zero-bubble schedule's B and
// W, run as separate actions) the input gradient alone, then the parameter gradients alone.
// B's hooks see the input gradient but must leave the parameter gradients alone; W's see those
// and no input gradient (grad_input is null).
enum class BackwardPart { whole, input, weight };

// One layer of one micro-batch, as every hook sees it. The runner holds the layer's input
// ([rows, in], this rank's local tensors); the layer computes on `layer_input` ([layer_rows,
// in]), the same unless a before-hook substitutes another input and row count (rows gathered
// from a group, say): the runner then sizes the layer's outputs for them, the next layer
// receives that many, and backward and recomputation use the same counts. A before-hook may
// also give the layer's outputs other rows than it computes on (`output_rows`: a sum over a
// group split into row blocks, say; 0: layer_rows).
// `unit_values` and `unit_grads` are where this use reads the layer's parameters and writes their
// gradients: the layer's unit (its tensors in the store's layout, from the unit's first element),
// the store's own unless a before-hook points either elsewhere (a gathered copy of sharded
// parameters, a transient gradient buffer laid out alike); a before-hook may also make the
// gradients overwrite instead of accumulate. The runner places the layer's tensors from them
// after the before-hooks; `parameters` (the layer's shape, and for a Linear layer its tensors as
// placed) is read-only to hooks. Activations and their gradients are of `activation_type` (the
// run's param type). Pointers not yet computed at the hook's point are null.
struct LayerEvent {
  int layer = 0;
  int micro_batch = 0;
  int micro_batches = 1;
  bool training = true;  // false while evaluating
  DataType activation_type = DataType::float32;
  std::int64_t rows = 0;
  const void* input = nullptr;
  std::int64_t layer_rows = 0;
  const void* layer_input = nullptr;
  std::int64_t output_rows = 0;
  void* unit_values = nullptr;
  void* unit_grads = nullptr;
  bool accumulate_grads = false;  // add into the gradients (later micro-batches) or overwrite
  const LinearLayer* parameters = nullptr;

  bool last_micro_batch() const { return micro_batch == micro_batches - 1; }
  std::int64_t output_row_count() const { return output_rows > 0 ? output_rows : layer_rows; }
};

// A layer's forward. With output rows other than the layer's rows, the product x W^T goes to
// `product` ([layer_rows, out], transient) and the substituting strategy fills `pre`
// ([output_rows, out]) from it in after_layer_matmul; the activation applies to the output rows.
// Without such a substitution product is pre.
struct ForwardEvent : LayerEvent {
  // A forward run again in backward (--recompute) for activations the first forward dropped:
  // the same computation, so the same hooks, but the layer's backward follows right after.
  bool recomputing = false;
  // Set by a before-hook whose after_layer_matmul sums partial products: the GEMM leaves the
  // bias out and that hook adds it to the sum, in fp32 before the sum is rounded (§2.7).
  BiasPlace bias = BiasPlace::in_product;
  void* product = nullptr;  // x W^T ([layer_rows, out]), + b unless the bias comes after a sum
  void* pre = nullptr;      // x W^T + b ([output_rows, out])
  void* output = nullptr;   // the layer's output (GELU(pre) or pre)

  // A before-hook's substitution of what the layer computes on.
  void substitute_input(const void* input_rows, std::int64_t row_count) {
    layer_input = input_rows;
    layer_rows = row_count;
  }
};

// A layer's backward (or its B or W). The runner holds where d loss / d input goes
// (`grad_input`, null for the model's first layer and in W); a before-hook that substituted the
// input gives the layer `layer_grad_input` for d loss / d layer_input and maps it back into
// grad_input in its after-hook. With output rows other than the layer's, the substituting
// strategy fills `grad_product` ([layer_rows, out]) from `grad_pre` ([output_rows, out]) in
// before_layer_matmul_backward; without, grad_product is null (grad_pre serves).
struct BackwardEvent : LayerEvent {
  BackwardPart part = BackwardPart::whole;
  void* grad_input = nullptr;
  void* layer_grad_input = nullptr;
  const void* grad_output = nullptr;  // d loss / d output ([output_rows, out])
  const void* grad_pre = nullptr;     // d loss / d pre ([output_rows, out])
  void* grad_product = nullptr;       // d loss / d product ([layer_rows, out]) if split

  // A before-hook's substitution of what the layer computes on, and where its input gradient
  // goes instead (ignored where there is no input gradient).
  void substitute_input(const void* input_rows, std::int64_t row_count, void* grad_rows) {
    layer_input = input_rows;
    layer_rows = row_count;
    layer_grad_input = grad_input != nullptr ? grad_rows : nullptr;
  }
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

// Owns a strategy's objects; what it can do is in the capabilities it implements.
class Strategy {
 public:
  virtual ~Strategy() = default;
};

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_step(const StepEvent&) {}
  virtual void before_layer_forward(ForwardEvent&) {}
  // Between the matrix product and the activation: product holds x W^T (+ b; an MoE layer's: its
  // experts' combined output), and pre must hold what the activation applies to, bias included,
  // when the hooks return (they are the same memory unless a before-hook changed the output rows).
  virtual void after_layer_matmul(ForwardEvent&) {}
  // The layer's output is complete (what it computed on can be let go).
  virtual void after_layer_forward(const ForwardEvent&) {}
  // Backward hooks run for each part of a split backward (BackwardEvent::part says which).
  virtual void before_layer_backward(BackwardEvent&) {}
  // Between the activation's backward and the products': grad_pre holds d loss / d pre, and
  // grad_product must hold d loss / d product when the hooks return (the same memory unless the
  // output rows differ from the rows the layer computes on).
  virtual void before_layer_matmul_backward(BackwardEvent&) {}
  // The layer's parameter gradients for this micro-batch are complete (B: its input gradient);
  // the event's pointers still name the memory a hook maps back from (layer_grad_input).
  virtual void after_layer_backward(const BackwardEvent&) {}
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

// The roles a strategy plays. Exclusive roles have one owner per run; the others compose.
enum class Role {
  reduces_gradients,  // sums gradients over replicas (exclusive)
  owns_schedule,      // splits the layers into stages and orders the step (exclusive)
  shards_state,       // places the training state (exclusive)
  exchanges_experts,  // connects MoE layers to their experts (exclusive)
  splits_tensors,     // narrows tensors to this rank's slices (composes)
};
std::string_view role_name(Role role);
bool exclusive(Role role);

struct StrategyRegistration {
  std::string_view name;
  std::span<const Role> roles;
  // Composition, declared rather than implied by the registry's order. `replaces`: strategies
  // whose work this one does itself; when both are wanted only this one takes part (ZeRO sums
  // gradients over the data-parallel group, so plain data parallelism steps aside). `runs_after`:
  // strategies whose hooks run before this one's at every hook point when both take part.
  // Strategies with no declared order between them must not depend on one: their hooks run in
  // the order of their names.
  std::span<const std::string_view> replaces{};
  std::span<const std::string_view> runs_after{};
  // The options the strategy owns (strategy_options.hpp), and its rules on the configuration
  // once dp is known: it throws UsageError naming the offending option. Called for every
  // registration, wanted or not.
  std::span<const Option> options{};
  void (*validate)(const Config& config) = nullptr;
  bool (*wanted)(const Config& config, const GridShape& shape);
  std::unique_ptr<Strategy> (*create)(const StrategyContext& context);
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
};

// Every strategy (in no meaningful order: see StrategyRegistration for how they compose).
std::span<const StrategyRegistration> strategy_registry();

}  // namespace mlptrain
