// ZeRO's parameter paths (see zero_parameters.hpp).
#include "strategies/zero/zero_parameters.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <stdexcept>

namespace mlptrain {

ParametersHeld::ParametersHeld(const ZeroShards& shards) : shards_(shards), gathers_(shards.units().size()) {
  shards_.move_store_values_to_collective_memory();
}

void* ParametersHeld::begin_forward(std::size_t unit, bool) {
  wait_all(gathers_[unit]);  // the previous step's gather of this unit
  return nullptr;
}

void ParametersHeld::after_update() {
  ParameterStore& store = shards_.store();
  const DataType type = shards_.precision().param;
  for (std::size_t index = 0; index < shards_.units().size(); ++index) {
    const ZeroUnit& unit = shards_.units()[index];
    gathers_[index] = shards_.per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
      return group.all_gather_in_place_async(store.value_at(unit.full.offset + at), piece.shard_size, type);
    });
  }
}

void ParametersHeld::progress() {
  for (std::vector<Request>& requests : gathers_) test_all(requests);
}

void* ParametersHeld::shard_values(std::size_t store_element, std::size_t) const {
  return shards_.store().value_at(store_element);
}

ParametersGatheredPerUse::ParametersGatheredPerUse(const ZeroShards& shards, ZeroGradientPath& gradients)
    : shards_(shards), gradients_(gradients) {
  const ZeroLayout& layout = shards_.layout();
  const Precision& precision = shards_.precision();
  shard_values_ = shards_.allocator().allocate_elements(MemoryState::params, layout.shard_total, precision.param);
  shard_values_.fill_zero();
  const ZeroSlotLayout slot = zero_slot_layout(layout, precision);
  slot_grads_at_ = slot.grads_offset;
  slot_bytes_ = slot.bytes;
  // The slots are what the collectives work on: charged as comm_buffers, they leave the params
  // at exactly the shards (16 bytes per parameter over N ranks in all).
  slot_pool_ = shards_.collective_buffer(MemoryState::comm_buffers, 2 * slot_bytes_);
}

ParametersGatheredPerUse::~ParametersGatheredPerUse() {
  if (std::uncaught_exceptions() > 0) return;
  for (std::size_t slot = 0; slot < 2; ++slot) gradients_.release(slot_grads(slot));
}

std::size_t ParametersGatheredPerUse::free_slot() {
  // A slot no gathered unit holds, preferring one whose earlier unit's gradients are no longer
  // being reduced (else they are waited for). Forward and backward hold one unit and take the
  // other slot for the next; recomputation holds backward's prefetched unit and cycles the
  // recomputed ones through the other.
  const auto held = [&](std::size_t slot) {
    return std::any_of(gathered_.begin(), gathered_.end(), [slot](const auto& entry) { return entry.second.slot == slot; });
  };
  std::optional<std::size_t> chosen;
  for (std::size_t slot = 0; slot < 2; ++slot)
    if (!held(slot) && (!chosen || gradients_.reading(slot_grads(*chosen)))) chosen = slot;
  if (!chosen) throw std::logic_error("ZeRO stage 3: both parameter slots hold gathered units");
  gradients_.release(slot_grads(*chosen));
  return *chosen;
}

void ParametersGatheredPerUse::prefetch(std::size_t index) {
  if (index >= shards_.units().size() || gathered_.contains(index)) return;
  const ZeroUnit& unit = shards_.units()[index];
  const std::size_t slot = free_slot();
  void* buffer = slot_values(slot);
  const DataType type = shards_.precision().param;
  for (const ZeroSegment& piece : unit.segments)
    shards_.kernels().copy(shards_.value_at(buffer, shards_.shard_in_unit(unit, piece)),
                           shards_.value_at(shard_values_.as<void>(), piece.shard_offset), type, piece.shard_size);
  Gathered entry{slot, shards_.per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
                   return group.all_gather_in_place_async(shards_.value_at(buffer, at), piece.shard_size, type);
                 })};
  gathered_.emplace(index, std::move(entry));
}

std::size_t ParametersGatheredPerUse::gathered(std::size_t index) {
  prefetch(index);
  Gathered& entry = gathered_.at(index);
  wait_all(entry.requests);
  return entry.slot;
}

void* ParametersGatheredPerUse::begin_forward(std::size_t unit, bool recomputing) {
  void* values = slot_values(gathered(unit));
  // A recomputed forward is followed by backward, which prefetches on its own.
  if (!recomputing && shards_.same_chunk(unit, unit + 1)) prefetch(unit + 1);
  return values;
}

ZeroParameterPath::BackwardBuffers ParametersGatheredPerUse::begin_backward(std::size_t unit) {
  const std::size_t slot = gathered(unit);
  if (shards_.same_chunk(unit, unit - 1)) prefetch(unit - 1);  // (none before unit 0)
  return {.values = slot_values(slot), .lent_grads = slot_grads(slot)};
}

void ParametersGatheredPerUse::progress() {
  for (auto& [unit, entry] : gathered_) test_all(entry.requests);
}

void* ParametersGatheredPerUse::shard_values(std::size_t, std::size_t in_shard) const {
  return shards_.value_at(shard_values_.as<void>(), in_shard);
}

std::unique_ptr<ZeroParameterPath> make_parameter_path(const ZeroShards& shards, int stage,
                                                       ZeroGradientPath& gradients) {
  if (stage == 3) return std::make_unique<ParametersGatheredPerUse>(shards, gradients);
  return std::make_unique<ParametersHeld>(shards);
}

}  // namespace mlptrain
