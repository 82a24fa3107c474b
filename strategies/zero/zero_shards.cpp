// ZeRO's shared unit machinery (see zero_shards.hpp).
#include "strategies/zero/zero_shards.hpp"

#include <stdexcept>
#include <string>

namespace mlptrain {

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.wait();
}

void test_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.test();
}

ZeroShards::ZeroShards(const StrategyContext& context)
    : groups_(context.groups),
      kernels_(context.kernels),
      allocator_(context.allocator),
      store_(context.parameters),
      precision_(store_.precision()),
      layout_(zero_layout(store_.tensors(), store_.unit_multiple(), context.layers, context.local,
                          context.config.training.recompute, context.groups.shape(),
                          zero_fp8_gathers(context.config))),
      local_(context.local) {}

std::size_t ZeroShards::unit_of(int layer) const {
  const int index = local_.local_index(layer);
  if (index < 0) throw std::logic_error("ZeRO: layer " + std::to_string(layer) + " is not one of this rank's units");
  return static_cast<std::size_t>(index);
}

Communicator& ZeroShards::collective_group() const {
  return groups_.group(sharding_group(groups_.shape(), GroupKind::data));
}

Buffer ZeroShards::collective_buffer(MemoryState state, std::size_t bytes) const {
  Buffer buffer = collective_group().allocate_collective_memory(allocator_, state, bytes);
  buffer.fill_zero();
  return buffer;
}

void ZeroShards::move_store_values_to_collective_memory() const {
  store_.reallocate_values([&](std::size_t bytes) {
    return collective_group().allocate_collective_memory(allocator_, MemoryState::params, bytes);
  });
}

void ZeroShards::move_store_grads_to_collective_memory() const {
  store_.reallocate_grads([&](std::size_t bytes) {
    return collective_group().allocate_collective_memory(allocator_, MemoryState::grads, bytes);
  });
}

}  // namespace mlptrain
