// ZeRO stages 1-3 on the data-parallel group (Rajbhandari et al., "ZeRO: memory optimizations
// toward training trillion parameter models", 2020), over the units of zero_units.hpp: rank r of
// N owns shard r of every unit: its optimizer state (all stages), its gradients (stages 2 and 3)
// and its parameters (stage 3). A rank updates only what it owns; the loop and the optimizer see
// that through the placement of the state (StateRun), never through this file.
//   stage 1: full gradients accumulate locally; when a unit's last micro-batch is done, its
//            gradients are reduce-scattered (in place: each rank's own block gets the sum); after
//            the optimizer, each unit's parameters are all-gathered, overlapping the next forward.
//   stage 2: as 1, but every micro-batch's unit gradients go to a transient unit buffer that is
//            reduce-scattered into the shard accumulator at once (two buffers rotate, so one
//            reduces while the next unit computes).
//   stage 3: parameters live only as shards; a unit is gathered before its forward (and again
//            before its backward, and before a recomputed forward) into one of two buffers, the
//            next unit's gather prefetched while the current one computes, and released right
//            after use. In backward the unit's gradients overwrite its gathered parameters (W's
//            last use comes first), and that buffer is reduce-scattered before it is reused.
// The transient unit buffers (two unit gradient buffers in stage 2, two gathered units in stage
// 3) are fixed pools charged as comm_buffers for the whole run: they are what the collectives
// work on, and keeping them apart leaves params, grads and optimizer state at exactly the ZeRO
// figures (16Ψ/N for stage 3). With N = 1 nothing is sharded and nothing communicated.
// Gathers move the param type (each owner's shard is its masters rounded by the update),
// reductions the reduce type. When the two differ, a stage 3 slot holds the gathered parameters
// and after them room for the unit's gradients, which then cannot overwrite the parameters.
// An MoE layer's unit has two pieces with different replicas: its router is sharded over the
// data-parallel group like a dense layer, its experts over the ranks that hold the same experts
// (the edp group; with one such rank that piece is the rank's own, and nothing is sent). Every
// collective below is one per piece, over the piece's group.
#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>

#include "strategies/strategy.hpp"
#include "strategies/zero_units.hpp"

namespace mlptrain {

namespace {

// A unit's full gradients of one micro-batch, being reduce-scattered (stages 2 and 3; in stage 3
// the buffer is the unit's gathered parameter buffer).
struct ReducingGradients {
  std::size_t unit = 0;
  int micro_batch = 0;
  std::size_t slot = 0;
  void* buffer = nullptr;
  std::vector<Request> requests;  // one per piece shared over more than one rank
};

// A unit's parameters gathered from the shards (stage 3).
struct GatheredParameters {
  std::size_t slot = 0;
  std::vector<Request> requests;
};

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.wait();
}
void test_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.test();
}

class Zero final : public Strategy, public LayerHooks, public StateSharding {
 public:
  explicit Zero(const StrategyContext& context);

  void before_layer_forward(LayerEvent& event) override;
  void after_layer_forward(LayerEvent& event) override;
  void before_layer_backward(LayerEvent& event) override;
  void after_layer_backward(LayerEvent& event) override;
  void synchronize_gradients(const StepEvent& event) override;
  void after_optimizer_step(const StepEvent& event) override;

  StatePlacement state_placement() const override;

 private:
  std::size_t unit_index(int layer) const { return static_cast<std::size_t>(layer - first_layer_); }
  Communicator& group(const ZeroSegment& piece) const { return groups_.group(piece.group); }
  // Where this rank's shard of a piece starts: in the store's layout, and from the unit's start.
  std::size_t shard_start(const ZeroSegment& piece) const {
    return piece.range.offset + static_cast<std::size_t>(group(piece).rank()) * piece.shard_size;
  }
  std::size_t shard_in_unit(const ZeroUnit& unit, const ZeroSegment& piece) const {
    return shard_start(piece) - unit.full.offset;
  }
  // Starts one collective per piece shared over more than one rank, on the piece's place in a
  // unit buffer laid out as the store's.
  template <typename Start>
  std::vector<Request> per_piece(const ZeroUnit& unit, Start start) const {
    std::vector<Request> requests;
    for (const ZeroSegment& piece : unit.segments)
      if (piece.ranks > 1) requests.push_back(start(group(piece), piece, piece.range.offset - unit.full.offset));
    return requests;
  }
  // Non-blocking collectives move only inside MPI calls (or when tested): poll between layers.
  void progress();

  void* value_at(void* base, std::size_t element) const { return advance(base, element, precision_.param); }
  void* grad_at(void* base, std::size_t element) const { return advance(base, element, precision_.reduce); }

  // Stage 3: the slot holding the unit's gathered parameters (gathering now if no prefetch
  // started it), and where a slot's parameters and gradients sit.
  std::size_t gathered(std::size_t unit);
  void prefetch(std::size_t unit);
  std::size_t free_parameter_slot();
  void release(std::size_t unit) { gathered_.erase(unit); }
  void* slot_values(std::size_t slot) const { return parameter_pool_.as<char>() + slot * slot_bytes_; }
  void* slot_grads(std::size_t slot) const { return static_cast<char*>(slot_values(slot)) + slot_grads_at_; }

  // Stage 2: a free unit gradient buffer, finishing older reductions as needed.
  std::size_t take_gradient_slot();
  void finish_oldest_reduction();

  const ProcessGroups& groups_;
  Kernels& kernels_;
  ParameterStore& parameters_;
  const int stage_;
  const int first_layer_;
  const GridShape& shape_;
  const GridCoordinates& place_;
  const Precision precision_;
  const ZeroLayout layout_;
  const std::vector<ZeroUnit>& units_ = layout_.units;
  std::size_t slot_bytes_ = 0;     // stage 3: a parameter slot...
  std::size_t slot_grads_at_ = 0;  // ...and where its gradients start in it

  Buffer shard_values_;     // stage 3
  Buffer shard_grads_;      // stages 2 and 3: the shard accumulator
  Buffer gradient_pool_;    // stage 2: unit gradient buffers
  Buffer parameter_pool_;   // stage 3: gathered unit buffers (and gradients in backward)
  std::size_t gradient_slots_ = 0;
  std::size_t next_gradient_slot_ = 0;

  std::vector<std::vector<Request>> gradient_reductions_;  // stage 1, per unit
  std::vector<std::vector<Request>> parameter_gathers_;    // stages 1 and 2, per unit
  std::deque<ReducingGradients> reducing_;     // stages 2 and 3, oldest first
  std::map<std::size_t, GatheredParameters> gathered_;  // stage 3
};

Zero::Zero(const StrategyContext& context)
    : groups_(context.groups),
      kernels_(context.kernels),
      parameters_(context.parameters),
      stage_(context.config.zero),
      first_layer_(context.local.first),
      shape_(context.groups.shape()),
      place_(context.groups.place()),
      precision_(parameters_.precision()),
      layout_(zero_layout(parameters_.tensors(), parameters_.unit_multiple(), context.layers, context.local,
                          context.config.recompute, shape_)) {
  Allocator& allocator = context.allocator;
  // Collective memory is the data-parallel group's (an edp group's ranks are among its ranks).
  Communicator& data = groups_.group(GroupKind::data);
  const auto collective = [&](MemoryState state, std::size_t bytes) {
    Buffer buffer = data.allocate_collective_memory(allocator, state, bytes);
    buffer.fill_zero();
    return buffer;
  };
  // What is reduced or gathered in place lives where the group does that fastest.
  if (stage_ <= 2)
    parameters_.reallocate_values([&](std::size_t bytes) {
      return data.allocate_collective_memory(allocator, MemoryState::params, bytes);
    });
  if (stage_ == 1)
    parameters_.reallocate_grads([&](std::size_t bytes) {
      return data.allocate_collective_memory(allocator, MemoryState::grads, bytes);
    });
  // Padding is summed and gathered but never written by the layers: it starts (and stays) zero.
  if (stage_ == 1) kernels_.fill(parameters_.grads(), precision_.reduce, parameters_.size(), 0.0f);
  if (stage_ >= 2) shard_grads_ = allocator.allocate_elements(MemoryState::grads, layout_.shard_total, precision_.reduce);
  if (stage_ == 2) {
    gradient_slots_ = 2;
    gradient_pool_ = collective(MemoryState::comm_buffers, gradient_slots_ * layout_.largest_unit * precision_.reduce_bytes());
  }
  if (stage_ == 3) {
    shard_values_ = allocator.allocate_elements(MemoryState::params, layout_.shard_total, precision_.param);
    shard_values_.fill_zero();
    // Gradients and the second slot start on 256-byte boundaries: fp32 gradients after an odd
    // number of bf16 values would be misaligned (and slower on any device).
    const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
    slot_grads_at_ = precision_.param == precision_.reduce ? 0 : aligned(layout_.largest_unit * precision_.param_bytes());
    slot_bytes_ =
        aligned(slot_grads_at_ + layout_.largest_unit * std::max(precision_.param_bytes(), precision_.reduce_bytes()));
    parameter_pool_ = collective(MemoryState::comm_buffers, 2 * slot_bytes_);
  }
  gradient_reductions_.resize(units_.size());
  parameter_gathers_.resize(units_.size());
}

StatePlacement Zero::state_placement() const {
  StatePlacement placement{.precision = precision_};
  placement.moment_count = layout_.shard_total;
  for (const ZeroUnit& unit : units_)
    for (const ZeroSegment& piece : unit.segments) {
      const std::size_t begin = shard_start(piece), end = begin + piece.shard_size;
      for (const ParameterTensor& tensor : parameters_.tensors()) {
        if (tensor.layer != unit.layer) continue;
        const std::size_t first = std::max(begin, tensor.offset);
        const std::size_t last = std::min(end, tensor.offset + tensor.count);
        if (first >= last) continue;
        const std::size_t in_shard = piece.shard_offset + (first - begin);
        // Every element of the shard is this rank's alone within the piece's group; a tensor
        // replicated over the tensor-parallel group is counted by one of its ranks.
        const bool owned = !tensor.replicated_over_tensor || place_.tp == tensor.global_index % shape_.tp;
        append_local_range(placement.updated, tensor, first - tensor.offset, last - first,
                           stage_ == 3 ? value_at(shard_values_.as<void>(), in_shard) : parameters_.value_at(first),
                           stage_ == 1 ? parameters_.grad_at(first) : grad_at(shard_grads_.as<void>(), in_shard),
                           in_shard, owned, precision_);
      }
    }
  // Stage 3 holds its shards; stages 1 and 2 hold every local value (read back on resume).
  placement.held = stage_ == 3 ? placement.updated : store_placement(parameters_, {}, {}).held;
  return placement;
}

void Zero::progress() {
  for (std::vector<Request>& requests : gradient_reductions_) test_all(requests);
  for (std::vector<Request>& requests : parameter_gathers_) test_all(requests);
  for (ReducingGradients& reducing : reducing_) test_all(reducing.requests);
  for (auto& [unit, parameters] : gathered_) test_all(parameters.requests);
}

std::size_t Zero::free_parameter_slot() {
  // A slot no gathered unit holds, preferring one whose earlier unit's gradients are no longer
  // on their way out (else they are waited for). Forward and backward hold one unit and take
  // the other slot for the next; recomputation holds backward's prefetched unit and cycles the
  // recomputed ones through the other.
  const auto reducing_in = [&](std::size_t slot) {
    return std::any_of(reducing_.begin(), reducing_.end(),
                       [slot](const ReducingGradients& reducing) { return reducing.slot == slot; });
  };
  const auto held = [&](std::size_t slot) {
    return std::any_of(gathered_.begin(), gathered_.end(), [slot](const auto& entry) { return entry.second.slot == slot; });
  };
  std::optional<std::size_t> chosen;
  for (std::size_t slot = 0; slot < 2; ++slot)
    if (!held(slot) && (!chosen || reducing_in(*chosen))) chosen = slot;
  if (!chosen) throw std::logic_error("ZeRO stage 3: both parameter slots hold gathered units");
  while (reducing_in(*chosen)) finish_oldest_reduction();
  return *chosen;
}

void Zero::prefetch(std::size_t index) {
  if (index >= units_.size() || gathered_.contains(index)) return;
  const ZeroUnit& unit = units_[index];
  const std::size_t slot = free_parameter_slot();
  void* buffer = slot_values(slot);
  for (const ZeroSegment& piece : unit.segments)
    kernels_.copy(value_at(buffer, shard_in_unit(unit, piece)), value_at(shard_values_.as<void>(), piece.shard_offset),
                  precision_.param, piece.shard_size);
  GatheredParameters entry{slot, per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
                             return group.all_gather_in_place_async(value_at(buffer, at), piece.shard_size,
                                                                    precision_.param);
                           })};
  gathered_.emplace(index, std::move(entry));
}

std::size_t Zero::gathered(std::size_t index) {
  prefetch(index);
  GatheredParameters& entry = gathered_.at(index);
  wait_all(entry.requests);
  return entry.slot;
}

void Zero::finish_oldest_reduction() {
  ReducingGradients& oldest = reducing_.front();
  wait_all(oldest.requests);
  const ZeroUnit& unit = units_[oldest.unit];
  for (const ZeroSegment& piece : unit.segments) {
    const void* own_block = grad_at(oldest.buffer, shard_in_unit(unit, piece));
    void* accumulator = grad_at(shard_grads_.as<void>(), piece.shard_offset);
    if (oldest.micro_batch == 0) {
      kernels_.copy(accumulator, own_block, precision_.reduce, piece.shard_size);
    } else {
      kernels_.add(accumulator, own_block, precision_.reduce, piece.shard_size);
    }
  }
  reducing_.pop_front();
}

std::size_t Zero::take_gradient_slot() {
  // Buffers are handed out in turn and freed in the same order, so the next one is free once
  // fewer reductions than buffers are in flight.
  while (reducing_.size() >= gradient_slots_) finish_oldest_reduction();
  const std::size_t slot = next_gradient_slot_;
  next_gradient_slot_ = (next_gradient_slot_ + 1) % gradient_slots_;
  return slot;
}

void Zero::before_layer_forward(LayerEvent& event) {
  const std::size_t index = unit_index(event.layer);
  if (stage_ == 3) {
    event.unit_values = slot_values(gathered(index));
    // A recomputed forward is followed by backward, which prefetches on its own.
    if (!event.recomputing) prefetch(index + 1);
  } else {
    wait_all(parameter_gathers_[index]);  // the previous step's gather of this unit
  }
  progress();
}

void Zero::after_layer_forward(LayerEvent& event) {
  if (stage_ == 3) release(unit_index(event.layer));
}

void Zero::before_layer_backward(LayerEvent& event) {
  const std::size_t index = unit_index(event.layer);
  if (stage_ >= 2) {
    // This micro-batch's gradients of the unit go to a unit buffer, written, not accumulated:
    // in stage 3 over (or after) the gathered parameters themselves.
    ReducingGradients reducing{.unit = index, .micro_batch = event.micro_batch};
    if (stage_ == 3) {
      reducing.slot = gathered(index);
      reducing.buffer = slot_grads(reducing.slot);
      event.unit_values = slot_values(reducing.slot);
    } else {
      reducing.slot = take_gradient_slot();
      reducing.buffer = grad_at(gradient_pool_.as<void>(), reducing.slot * layout_.largest_unit);
    }
    event.unit_grads = reducing.buffer;
    event.accumulate_grads = false;
    reducing_.push_back(std::move(reducing));
  }
  if (stage_ == 3 && index > 0) prefetch(index - 1);
  progress();
}

void Zero::after_layer_backward(LayerEvent& event) {
  const std::size_t index = unit_index(event.layer);
  const ZeroUnit& unit = units_[index];
  if (stage_ == 1) {
    if (event.last_micro_batch())
      gradient_reductions_[index] = per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
        return group.reduce_scatter_in_place_async(parameters_.grad_at(unit.full.offset + at), piece.shard_size,
                                                   precision_.reduce);
      });
  } else {
    ReducingGradients& latest = reducing_.back();
    latest.requests = per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
      return group.reduce_scatter_in_place_async(grad_at(latest.buffer, at), piece.shard_size, precision_.reduce);
    });
  }
  if (stage_ == 3) release(index);
  progress();
}

void Zero::synchronize_gradients(const StepEvent&) {
  for (std::vector<Request>& requests : gradient_reductions_) wait_all(requests);
  while (!reducing_.empty()) finish_oldest_reduction();
}

void Zero::after_optimizer_step(const StepEvent&) {
  // Stages 1 and 2: every rank updated its shard; gather the units back, overlapping the next
  // forward (which waits for each unit before using it).
  if (stage_ == 3) return;
  for (std::size_t index = 0; index < units_.size(); ++index) {
    const ZeroUnit& unit = units_[index];
    parameter_gathers_[index] = per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
      return group.all_gather_in_place_async(parameters_.value_at(unit.full.offset + at), piece.shard_size,
                                             precision_.param);
    });
  }
}

bool wanted(const Config& config, const GridShape&) { return config.zero > 0; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates&, ParameterPlan& plan) {
  plan.unit_multiple = std::max(plan.unit_multiple, shape.dp);
  plan.hold_grads = plan.hold_grads && config.zero == 1;
  plan.hold_values = plan.hold_values && config.zero <= 2;
}

std::unique_ptr<Strategy> create(const StrategyContext& context) {
  return std::make_unique<Zero>(context);
}

constexpr Role roles[] = {Role::reduces_gradients, Role::shards_state};
// ZeRO sums the data-parallel group's gradients itself (reduce-scatter, not all-reduce).
constexpr std::string_view replaces[] = {"data_parallel"};

}  // namespace

extern const StrategyRegistration zero_registration{.name = "zero",
                                                    .roles = roles,
                                                    .replaces = replaces,
                                                    .wanted = wanted,
                                                    .create = create,
                                                    .plan = plan,
                                                    .predict = zero_predict,
                                                    .describe = zero_describe};

}  // namespace mlptrain
