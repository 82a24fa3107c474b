// Host staging of collectives on device memory (see host_staging.hpp).
#include "comm/host_staging.hpp"

#include <algorithm>
#include <numeric>

#include "comm/staging.hpp"

namespace mlptrain {

namespace {

std::size_t sum(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// The pipeline's copies, done at once through the staging's copy functions: a chunk's copy is
// complete when its start returns.
class ImmediateCopier final : public ChunkCopier {
 public:
  using Copy = std::function<void(std::size_t chunk, int slot)>;
  ImmediateCopier(Copy up, Copy down) : up_(std::move(up)), down_(std::move(down)) {}
  void start_to_host(std::size_t chunk, int slot) override { up_(chunk, slot); }
  void wait_to_host(std::size_t) override {}
  void start_to_device(std::size_t chunk, int slot) override { down_(chunk, slot); }
  void wait_to_device(std::size_t) override {}

 private:
  Copy up_, down_;
};

}  // namespace

HostStaging::HostStaging(Allocator& device, std::size_t chunk_bytes)
    : device_(device), chunk_bytes_(std::max<std::size_t>(chunk_bytes, 64)), slots_(staging_slots) {}

bool HostStaging::stages(const Operation& operation) const {
  return (operation.send != nullptr && device_.is_device_memory(operation.send)) ||
         (operation.receive != nullptr && device_.is_device_memory(operation.receive));
}

void StagedOperation::finish() {
  device_->copy_host_to_any(static_cast<std::byte*>(destination_) + down_offset_,
            static_cast<const std::byte*>(host_.receive) + down_offset_, down_bytes_);
}

void HostStaging::all_reduce(const Operation& operation,
                             const std::function<void(const Operation&)>& run_host) {
  const std::size_t element = size_of(operation.type);
  const std::size_t per_chunk = chunk_bytes_ / element;
  const std::size_t chunks = chunk_count(operation.count, per_chunk);
  for (auto& slot : slots_) slot.resize(std::min(operation.count, per_chunk) * element);
  const auto first = [&](std::size_t chunk) { return chunk * per_chunk; };
  const auto count = [&](std::size_t chunk) { return std::min(per_chunk, operation.count - first(chunk)); };
  ImmediateCopier copier(
      [&](std::size_t chunk, int slot) {
        device_.copy_any_to_host(slots_[slot].data(),
                static_cast<const std::byte*>(operation.send) + first(chunk) * element,
                count(chunk) * element);
      },
      [&](std::size_t chunk, int slot) {
        device_.copy_host_to_any(static_cast<std::byte*>(operation.receive) + first(chunk) * element,
                  slots_[slot].data(), count(chunk) * element);
      });
  run_staged_pipeline(chunks, copier, [&](std::size_t chunk, int slot) {
    Operation part = operation;
    part.count = count(chunk);
    part.send = part.receive = slots_[slot].data();  // in place on the slot
    run_host(part);
  });
}

std::shared_ptr<StagedOperation> HostStaging::stage(const Operation& operation, int rank,
                                                    int group_size) {
  const std::size_t element = size_of(operation.type);
  const auto ranks = static_cast<std::size_t>(group_size);
  const bool in_place = operation.send == operation.receive;
  const std::size_t block = operation.count * element;
  // Bytes of the send and the receive side, and what of them moves: an in-place reduce-scatter
  // only brings back this rank's block, an in-place all-gather only takes it up.
  std::size_t send_bytes = 0, receive_bytes = 0, up_offset = 0, up_bytes = 0, down_offset = 0,
              down_bytes = 0;
  switch (operation.op) {
    case CommOp::all_reduce:
      send_bytes = receive_bytes = up_bytes = down_bytes = block;
      break;
    case CommOp::reduce_scatter:
      send_bytes = up_bytes = block * ranks;
      receive_bytes = in_place ? send_bytes : block;
      down_offset = in_place ? block * static_cast<std::size_t>(rank) : 0;
      down_bytes = block;
      break;
    case CommOp::all_gather:
      send_bytes = in_place ? block * ranks : block;
      receive_bytes = down_bytes = block * ranks;
      up_offset = in_place ? block * static_cast<std::size_t>(rank) : 0;
      up_bytes = block;
      break;
    case CommOp::broadcast:  // the data leaves the root and lands everywhere else
      send_bytes = receive_bytes = block;
      (operation.peer == rank ? up_bytes : down_bytes) = block;
      break;
    case CommOp::send: send_bytes = up_bytes = block; break;
    case CommOp::recv: receive_bytes = down_bytes = block; break;
    case CommOp::all_to_all:
      send_bytes = up_bytes =
          (operation.send_counts.empty() ? operation.count * ranks : sum(operation.send_counts)) * element;
      receive_bytes = down_bytes =
          (operation.receive_counts.empty() ? operation.count * ranks : sum(operation.receive_counts)) *
          element;
      break;
  }
  auto staged = std::make_shared<StagedOperation>();
  staged->device_ = &device_;
  staged->send_.resize(send_bytes);
  staged->receive_.resize(in_place ? 0 : receive_bytes);
  staged->host_ = operation;
  // A broadcast and a recv have no send side: their one buffer is the receive buffer.
  const bool one_buffer = in_place || operation.op == CommOp::broadcast;
  std::byte* send_host = staged->send_.data();
  staged->host_.send = operation.send == nullptr ? nullptr : send_host;
  staged->host_.receive = operation.receive == nullptr ? nullptr
                          : one_buffer                 ? send_host
                                                       : staged->receive_.data();
  const void* source = operation.op == CommOp::broadcast ? operation.receive : operation.send;
  if (up_bytes > 0)
    device_.copy_any_to_host(send_host + up_offset, static_cast<const std::byte*>(source) + up_offset, up_bytes);
  staged->destination_ = operation.receive;
  staged->down_offset_ = down_offset;
  staged->down_bytes_ = down_bytes;
  return staged;
}

}  // namespace mlptrain
