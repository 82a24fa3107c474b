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
  if (unit.fp8_weight.count > 0) {
    gathered_.emplace(index, gather_in_fp8(unit, slot));
    return;
  }
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
  if (!entry.fp8_wire.empty()) {
    decode_fp8(shards_.units()[index], entry);
    entry.fp8_wire = Buffer{};
  }
  return entry.slot;
}

namespace {

// Where a shard of a unit meets its weight: the shard's elements [first, first + count) from the
// unit's start are weight, those before and after are not.
struct ShardPart {
  std::size_t first;
  std::size_t count;
};
ShardPart weight_part(std::size_t shard_first, std::size_t shard, const FlatRange& weight) {
  const std::size_t first = std::clamp(weight.offset, shard_first, shard_first + shard);
  const std::size_t last = std::clamp(weight.offset + weight.count, shard_first, shard_first + shard);
  return {first, last - first};
}

}  // namespace

ParametersGatheredPerUse::Gathered ParametersGatheredPerUse::gather_in_fp8(const ZeroUnit& unit, std::size_t slot) {
  const ZeroSegment& piece = unit.segments.front();
  Communicator& group = shards_.group(piece);
  Kernels& kernels = shards_.kernels();
  const DataType type = shards_.precision().param;
  const Fp8Wire wire = fp8_wire(unit);
  const std::size_t block = wire.block_bytes(size_of(type)), shard_first = shards_.shard_in_unit(unit, piece);
  const ShardPart weight = weight_part(shard_first, piece.shard_size, unit.fp8_weight);
  void* shard = shards_.value_at(shard_values_.as<void>(), piece.shard_offset);
  // The weight's scale from its amax over every shard.
  Buffer amax = shards_.allocator().allocate_floats(MemoryState::workspace, 1);
  kernels.fill(amax.floats(), DataType::float32, 1, 0.0f);
  if (weight.count > 0)
    kernels.absolute_max(shards_.value_at(shard, weight.first - shard_first), type, 1,
                         static_cast<std::int64_t>(weight.count), Fp8Scaling::tensor, amax.floats());
  group.all_reduce(amax.floats(), 1, ReduceOp::max);
  Gathered entry{.slot = slot,
                 .fp8_wire = shards_.allocator().allocate(MemoryState::workspace,
                                                          static_cast<std::size_t>(piece.ranks) * block),
                 .fp8_amax = std::move(amax)};
  auto* bytes = entry.fp8_wire.as<std::uint8_t>();
  std::uint8_t* mine = bytes + static_cast<std::size_t>(group.rank()) * block;
  kernels.encode_fp8(shards_.value_at(shard, weight.first - shard_first), type, weight.count, entry.fp8_amax.floats(),
                     Fp8Format::e4m3, mine + (weight.first - shard_first));
  // The shard's other elements, before and after the weight, in order.
  const std::size_t before = weight.count > 0 ? weight.first - shard_first : piece.shard_size;
  kernels.copy(mine + wire.codes_bytes(), shard, type, before);
  kernels.copy(mine + wire.codes_bytes() + before * size_of(type),
               shards_.value_at(shard, before + weight.count), type, piece.shard_size - before - weight.count);
  entry.requests.push_back(group.all_gather_in_place_async(bytes, block, DataType::uint8));
  return entry;
}

void ParametersGatheredPerUse::decode_fp8(const ZeroUnit& unit, const Gathered& entry) {
  const ZeroSegment& piece = unit.segments.front();
  Kernels& kernels = shards_.kernels();
  const DataType type = shards_.precision().param;
  const Fp8Wire wire = fp8_wire(unit);
  const std::size_t block = wire.block_bytes(size_of(type));
  const auto* bytes = entry.fp8_wire.as<std::uint8_t>();
  const float* amax = entry.fp8_amax.floats();
  void* values = slot_values(entry.slot);
  for (int rank = 0; rank < piece.ranks; ++rank) {
    const std::size_t shard_first = piece.range.offset - unit.full.offset + static_cast<std::size_t>(rank) * piece.shard_size;
    const ShardPart weight = weight_part(shard_first, piece.shard_size, unit.fp8_weight);
    const std::uint8_t* theirs = bytes + static_cast<std::size_t>(rank) * block;
    kernels.decode_fp8(theirs + (weight.first - shard_first), weight.count, amax, Fp8Format::e4m3,
                       shards_.value_at(values, weight.first), type);
    const std::size_t before = weight.count > 0 ? weight.first - shard_first : piece.shard_size;
    kernels.copy(shards_.value_at(values, shard_first), theirs + wire.codes_bytes(), type, before);
    kernels.copy(shards_.value_at(values, shard_first + before + weight.count),
                 theirs + wire.codes_bytes() + before * size_of(type), type, piece.shard_size - before - weight.count);
  }
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
