// ZeRO's gradient paths (see zero_gradients.hpp).
#include "strategies/zero/zero_gradients.hpp"

#include <algorithm>
#include <stdexcept>

namespace mlptrain {

GradientsReducedOnce::GradientsReducedOnce(const ZeroShards& shards)
    : shards_(shards), reductions_(shards.units().size()) {
  shards_.move_store_grads_to_collective_memory();
  // Padding is summed but never written by the layers: it starts (and stays) zero.
  shards_.kernels().fill(shards_.store().grads(), shards_.precision().reduce, shards_.store().size(), 0.0f);
}

void GradientsReducedOnce::end_backward(std::size_t index, bool last_micro_batch) {
  if (!last_micro_batch) return;
  const ZeroUnit& unit = shards_.units()[index];
  ParameterStore& store = shards_.store();
  const DataType type = shards_.precision().reduce;
  reductions_[index] = shards_.per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
    return group.reduce_scatter_in_place_async(store.grad_at(unit.full.offset + at), piece.shard_size, type);
  });
  reducing_.push_back(index);
}

void GradientsReducedOnce::start_sums_across(bool wait) {
  while (!reducing_.empty()) {
    std::vector<Request>& scatters = reductions_[reducing_.front()];
    if (wait) wait_all(scatters);
    test_all(scatters);
    if (!std::all_of(scatters.begin(), scatters.end(), [](const Request& request) { return request.done(); })) return;
    const ZeroUnit& unit = shards_.units()[reducing_.front()];
    for (Request& request : shards_.sum_across_replicas(unit, [&](const ZeroSegment& piece) {
           return shards_.store().grad_at(shards_.shard_start(piece));
         }))
      summing_across_.push_back(std::move(request));
    reducing_.pop_front();
  }
}

void GradientsReducedOnce::finish_step() {
  start_sums_across(true);
  wait_all(summing_across_);
  summing_across_.clear();
}

void GradientsReducedOnce::progress() {
  // Every unit's reduce-scatter is helped along (shared-memory collectives move when tested),
  // the sums across replicas start in order.
  for (std::vector<Request>& requests : reductions_) test_all(requests);
  start_sums_across(false);
  test_all(summing_across_);
}

void* GradientsReducedOnce::shard_grads(std::size_t store_element, std::size_t) const {
  return shards_.store().grad_at(store_element);
}

GradientsReducedEveryMicroBatch::GradientsReducedEveryMicroBatch(const ZeroShards& shards, std::size_t own_buffers)
    : shards_(shards), own_buffers_(own_buffers) {
  const ZeroLayout& layout = shards_.layout();
  const Precision& precision = shards_.precision();
  shard_grads_ = shards_.allocator().allocate_elements(MemoryState::grads, layout.shard_total, precision.reduce);
  // The unit buffers are what the collectives work on: charged as comm_buffers, they leave
  // the gradients at exactly the shards.
  if (own_buffers_ > 0)
    own_pool_ = shards_.collective_buffer(MemoryState::comm_buffers,
                                          own_buffers_ * layout.largest_unit * precision.reduce_bytes());
}

void* GradientsReducedEveryMicroBatch::take_own_buffer() {
  if (own_buffers_ == 0) throw std::logic_error("ZeRO: a unit's gradients have no buffer (none lent, none owned)");
  // Buffers are handed out in turn and freed in the same order, so the next one is free once
  // fewer reductions than buffers are in flight.
  while (reducing_.size() >= own_buffers_) finish_oldest();
  const std::size_t slot = next_own_buffer_;
  next_own_buffer_ = (next_own_buffer_ + 1) % own_buffers_;
  return shards_.grad_at(own_pool_.as<void>(), slot * shards_.layout().largest_unit);
}

void* GradientsReducedEveryMicroBatch::begin_backward(std::size_t unit, int micro_batch, void* lent) {
  void* buffer = lent != nullptr ? lent : take_own_buffer();
  reducing_.push_back({.unit = unit, .micro_batch = micro_batch, .buffer = buffer});
  return buffer;
}

void GradientsReducedEveryMicroBatch::end_backward(std::size_t index, bool last_micro_batch) {
  const ZeroUnit& unit = shards_.units()[index];
  Reducing& latest = reducing_.back();
  latest.last_micro_batch = last_micro_batch;
  const DataType type = shards_.precision().reduce;
  latest.requests = shards_.per_piece(unit, [&](Communicator& group, const ZeroSegment& piece, std::size_t at) {
    return group.reduce_scatter_in_place_async(shards_.grad_at(latest.buffer, at), piece.shard_size, type);
  });
}

void GradientsReducedEveryMicroBatch::finish_oldest() {
  Reducing& oldest = reducing_.front();
  wait_all(oldest.requests);
  const ZeroUnit& unit = shards_.units()[oldest.unit];
  const DataType type = shards_.precision().reduce;
  for (const ZeroSegment& piece : unit.segments) {
    const void* own_block = shards_.grad_at(oldest.buffer, shards_.shard_in_unit(unit, piece));
    void* accumulator = shards_.grad_at(shard_grads_.as<void>(), piece.shard_offset);
    if (oldest.micro_batch == 0) {
      shards_.kernels().copy(accumulator, own_block, type, piece.shard_size);
    } else {
      shards_.kernels().add(accumulator, own_block, type, piece.shard_size);
    }
  }
  if (oldest.last_micro_batch)
    for (Request& request : shards_.sum_across_replicas(unit, [&](const ZeroSegment& piece) {
           return shards_.grad_at(shard_grads_.as<void>(), piece.shard_offset);
         }))
      summing_across_.push_back(std::move(request));
  reducing_.pop_front();
}

void GradientsReducedEveryMicroBatch::finish_step() {
  while (!reducing_.empty()) finish_oldest();
  wait_all(summing_across_);
  summing_across_.clear();
}

void GradientsReducedEveryMicroBatch::progress() {
  for (Reducing& reducing : reducing_) test_all(reducing.requests);
  test_all(summing_across_);
}

bool GradientsReducedEveryMicroBatch::reading(const void* buffer) const {
  return std::any_of(reducing_.begin(), reducing_.end(),
                     [buffer](const Reducing& reducing) { return reducing.buffer == buffer; });
}

void GradientsReducedEveryMicroBatch::release(const void* buffer) {
  // Reductions finish in the order they started (each adds into the accumulator in micro-batch
  // order), so the ones before the last reader of `buffer` finish too.
  while (reading(buffer)) finish_oldest();
}

void* GradientsReducedEveryMicroBatch::shard_grads(std::size_t, std::size_t in_shard) const {
  return shards_.grad_at(shard_grads_.as<void>(), in_shard);
}

std::unique_ptr<ZeroGradientPath> make_gradient_path(const ZeroShards& shards, int stage) {
  if (stage == 1) return std::make_unique<GradientsReducedOnce>(shards);
  // Stage 3 writes gradients into the parameter path's gathered slot; stage 2 has two buffers.
  return std::make_unique<GradientsReducedEveryMicroBatch>(shards, stage == 2 ? 2 : 0);
}

}  // namespace mlptrain
