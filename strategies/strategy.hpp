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
#include "model/fp8_linear.hpp"
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

// Which part of a layer's backward a call is: all of it, or (a zero-bubble schedule's B and W,
// run as separate actions) the input gradient alone, then the parameter gradients alone.
enum class BackwardPart { whole, input, weight };

// The hooks of a layer receive views of what is valid at their point and nothing else. Every
// view says which layer of which micro-batch it is (LayerCall); activations and their gradients
// are this rank's local tensors, of `activation_type` (the run's param type). A layer computes on
// its `layer_rows` rows of `layer_input`: the rows it received unless a before-hook substitutes
// others (rows gathered from a group, say); its outputs may have other rows still
// (`output_rows`: a sum over a group split into row blocks). The runner sizes every buffer from
// those counts, in forward, backward and recomputation alike.
struct LayerCall {
  int layer;
  int micro_batch;
  int micro_batches;
  bool training;  // false while evaluating
  DataType activation_type;
  const LayerSpec& spec;

  bool last_micro_batch() const { return micro_batch == micro_batches - 1; }
};

// Where this use of a layer reads its parameters and writes their gradients: its unit (the
// layer's tensors in the store's layout, from the unit's first element), the store's own unless
// a before-hook points either elsewhere (a gathered copy of sharded parameters, a transient
// gradient buffer laid out alike), and whether the gradients add to what is there.
struct UnitMemory {
  void* values;
  void* grads;
  bool accumulate_grads;  // later micro-batches add; the first overwrites
};

// before_layer_forward: the layer's input and rows, which a hook may substitute or split, and
// its unit. The bias goes into the product unless a hook sums partial products first
// (add_bias_after_sum: that hook then adds it, in fp32 before the sum is rounded, §2.7).
class ForwardStart : public LayerCall {
 public:
  ForwardStart(const LayerCall& call, bool recomputing, std::int64_t rows, const void* input, UnitMemory unit)
      : LayerCall(call), recomputing(recomputing), rows(rows), input(input), unit(unit), layer_rows_(rows),
        layer_input_(input) {}

  // A forward run again in backward (--recompute) for activations the first forward dropped:
  // the same computation, so the same hooks, but the layer's backward follows right after.
  const bool recomputing;
  const std::int64_t rows;   // received
  const void* const input;   // [rows, in]
  UnitMemory unit;

  void substitute_input(const void* rows_data, std::int64_t count) {
    layer_input_ = rows_data;
    layer_rows_ = count;
  }
  // The outputs keep `count` of the rows the layer computes on (a block of a split sum).
  void split_output_rows(std::int64_t count) { output_rows_ = count; }
  void add_bias_after_sum() { bias_after_sum_ = true; }

  std::int64_t layer_rows() const { return layer_rows_; }
  const void* layer_input() const { return layer_input_; }
  std::int64_t output_rows() const { return output_rows_.value_or(layer_rows_); }
  bool bias_after_sum() const { return bias_after_sum_; }

 private:
  std::int64_t layer_rows_;
  const void* layer_input_;
  std::optional<std::int64_t> output_rows_;
  bool bias_after_sum_ = false;
};

// after_layer_matmul: the matrix product is done. `product` holds x W^T ([layer_rows, out], + b
// unless a before-hook moved the bias after its sum), and `pre` must hold what the activation
// applies to ([output_rows, out], bias included) when the hooks return: the same memory unless
// the rows differ (the hook that split them fills pre from product). An MoE layer's product is its
// experts' combined output.
struct ForwardProduct : LayerCall {
  std::int64_t layer_rows;
  std::int64_t output_rows;
  void* product;
  void* pre;
  std::optional<const void*> bias_after_sum;  // the bias to add after the sum, where a hook moved it
};

// after_layer_forward: the layer's output is complete (what it computed on can be let go).
struct ForwardDone : LayerCall {};

// before_layer_backward: the rows the forward computed on, the layer's unit, and what this part
// of the backward reads and writes: the input its weight gradients need (whole and W; B reads
// none) and where d loss / d input goes (whole and B; the model's first layer computes none). A
// hook that substituted the forward's input substitutes it again, with where the input gradient
// of the substituted rows goes, and maps that back into grad_input after the layer.
class BackwardStart : public LayerCall {
 public:
  BackwardStart(const LayerCall& call, BackwardPart part, std::int64_t rows, std::int64_t layer_rows,
                std::int64_t output_rows, UnitMemory unit, std::optional<const void*> input,
                std::optional<void*> grad_input)
      : LayerCall(call), part(part), rows(rows), layer_rows(layer_rows), output_rows(output_rows), unit(unit),
        input(input), grad_input(grad_input), layer_input_(input), layer_grad_input_(grad_input) {}

  const BackwardPart part;
  const std::int64_t rows;         // received in forward
  const std::int64_t layer_rows;   // computed on in forward
  const std::int64_t output_rows;  // of pre and the output
  UnitMemory unit;
  const std::optional<const void*> input;  // [rows, in]
  const std::optional<void*> grad_input;   // [rows, in]

  // What the layer computes on instead (ignored where this part reads no input) and where the
  // input gradient of those rows goes (ignored where it computes none).
  void substitute_input(const void* rows_data, void* grad_rows) {
    if (layer_input_) layer_input_ = rows_data;
    if (layer_grad_input_) layer_grad_input_ = grad_rows;
  }
  std::optional<const void*> layer_input() const { return layer_input_; }
  std::optional<void*> layer_grad_input() const { return layer_grad_input_; }

 private:
  std::optional<const void*> layer_input_;
  std::optional<void*> layer_grad_input_;
};

// before_layer_matmul_backward: the activation's backward is done. `grad_pre` holds d loss /
// d pre ([output_rows, out]), and `grad_product` must hold d loss / d product ([layer_rows, out])
// when the hooks return: the same memory unless the rows differ (the hook that split them fills
// it).
struct BackwardProduct : LayerCall {
  BackwardPart part;
  std::int64_t layer_rows;
  std::int64_t output_rows;
  const void* grad_pre;
  void* grad_product;
};

// after_layer_backward: this part's gradients are complete. Where it computed an input
// gradient, `computed` holds it for the rows the layer computed on ([layer_rows, in]) and
// `destination` is where the rows the layer received want it ([rows, in]): the same memory unless
// a before-hook substituted the input, which then maps one into the other here.
struct InputGradient {
  void* computed;
  void* destination;
};
struct BackwardDone : LayerCall {
  BackwardPart part;
  std::int64_t rows;
  std::int64_t layer_rows;
  std::optional<InputGradient> input_gradient;
};

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

// Owns a strategy's objects; what it can do is in the capabilities it implements.
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

// The roles a strategy plays. Exclusive roles have one owner per run; the others compose.
enum class Role {
  reduces_gradients,  // sums gradients over replicas (exclusive)
  owns_schedule,      // splits the layers into stages and orders the step (exclusive)
  shards_state,       // places the training state (exclusive)
  exchanges_experts,  // connects MoE layers to their experts (exclusive)
  splits_tensors,     // narrows tensors to this rank's slices (composes)
  agrees_fp8_scales,  // makes fp8 operands' scales those of their whole population (exclusive)
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
