// Host staging of collectives on device memory (see host_staging.hpp).
#include "comm/host_staging.hpp"

#include <algorithm>
#include <array>
#include <numeric>

#include "comm/staging.hpp"

namespace mlptrain {

namespace {

std::size_t sum(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// The pipeline's copies of one all-reduce between its device buffers and the slots: in the
// background on the device's copier (one lane per slot) where there is one, else at once (a
// chunk's copy is then complete when its start returns).
class SlotCopier final : public ChunkCopier {
 public:
  SlotCopier(Allocator& device, AsyncCopier* background, const Operation& operation,
             std::size_t chunk_bytes, std::array<std::byte*, staging_slots> slots)
      : device_(device), background_(background), operation_(operation), chunk_bytes_(chunk_bytes),
        total_bytes_(operation.count * size_of(operation.type)), slots_(slots) {}

  void start_to_host(std::size_t chunk, int slot) override {
    const auto* source = static_cast<const std::byte*>(operation_.send) + first(chunk);
    if (background_ != nullptr) {
      background_->start_to_host(slot, slots_[slot], source, bytes(chunk));
    } else {
      device_.copy_any_to_host(slots_[slot], source, bytes(chunk));
    }
  }
  void wait_to_host(std::size_t chunk) override {
    if (background_ != nullptr) background_->wait_to_host(lane(chunk));
  }
  void start_to_device(std::size_t chunk, int slot) override {
    auto* destination = static_cast<std::byte*>(operation_.receive) + first(chunk);
    if (background_ != nullptr) {
      background_->start_to_device(slot, destination, slots_[slot], bytes(chunk));
    } else {
      device_.copy_host_to_any(destination, slots_[slot], bytes(chunk));
    }
  }
  void wait_to_device(std::size_t chunk) override {
    if (background_ != nullptr) background_->wait_to_device(lane(chunk));
  }

 private:
  static int lane(std::size_t chunk) { return static_cast<int>(chunk % staging_slots); }
  std::size_t first(std::size_t chunk) const { return chunk * chunk_bytes_; }
  std::size_t bytes(std::size_t chunk) const {
    return std::min(chunk_bytes_, total_bytes_ - first(chunk));
  }

  Allocator& device_;
  AsyncCopier* background_;
  const Operation& operation_;
  std::size_t chunk_bytes_, total_bytes_;
  std::array<std::byte*, staging_slots> slots_;
};

}  // namespace

HostStaging::HostStaging(Allocator& device, std::size_t chunk_bytes)
    : device_(device),
      chunk_bytes_(std::max<std::size_t>(chunk_bytes, 64)),
      copier_(device.make_async_copier(staging_slots)),
      slots_(staging_slots) {}

std::byte* HostStaging::slot(int index, std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);  // never a null slot, even for an empty message
  Buffer& buffer = slots_[static_cast<std::size_t>(index)];
  if (buffer.bytes() < bytes) buffer = host_memory().allocate(MemoryState::comm_buffers, bytes);
  return buffer.as<std::byte>();
}

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
  // Background copies need both buffers on the device (the copier's lanes move device memory).
  const bool background = copier_ && device_.is_device_memory(operation.send) &&
                          device_.is_device_memory(operation.receive);
  std::array<std::byte*, staging_slots> slots{};
  for (int index = 0; index < staging_slots; ++index)
    slots[static_cast<std::size_t>(index)] = slot(index, std::min(operation.count, per_chunk) * element);
  SlotCopier copier(device_, background ? copier_.get() : nullptr, operation, per_chunk * element, slots);
  run_staged_pipeline(chunks, copier, [&](std::size_t chunk, int slot_index) {
    Operation part = operation;
    part.count = std::min(per_chunk, operation.count - chunk * per_chunk);
    part.send = part.receive = slots[static_cast<std::size_t>(slot_index)];  // in place on the slot
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
    case CommOp::reduce:  // the sum lands at the root only
      send_bytes = receive_bytes = up_bytes = block;
      down_bytes = operation.peer == rank ? block : 0;
      break;
    case CommOp::gather:  // as all_gather, with only the root receiving
      send_bytes = in_place ? block * ranks : block;
      receive_bytes = block * ranks;
      up_offset = in_place ? block * static_cast<std::size_t>(rank) : 0;
      up_bytes = block;
      down_bytes = operation.peer == rank ? block * ranks : 0;
      break;
    case CommOp::scatter:  // as reduce_scatter, with only the root sending
      send_bytes = block * ranks;
      up_bytes = operation.peer == rank ? send_bytes : 0;
      receive_bytes = in_place ? send_bytes : block;
      down_offset = in_place ? block * static_cast<std::size_t>(rank) : 0;
      down_bytes = block;
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
  // Blocks of the host memory's cache, their bytes as the last user left them: every byte the
  // operation reads is copied up or received first.
  staged->send_ = host_memory().allocate(MemoryState::comm_buffers, send_bytes);
  staged->receive_ = host_memory().allocate(MemoryState::comm_buffers, in_place ? 0 : receive_bytes);
  staged->host_ = operation;
  // A broadcast and a recv have no send side: their one buffer is the receive buffer.
  const bool one_buffer = in_place || operation.op == CommOp::broadcast;
  std::byte* send_host = staged->send_.as<std::byte>();
  staged->host_.send = operation.send == nullptr ? nullptr : send_host;
  staged->host_.receive = operation.receive == nullptr ? nullptr
                          : one_buffer                 ? send_host
                                                       : staged->receive_.as<std::byte>();
  const void* source = operation.op == CommOp::broadcast ? operation.receive : operation.send;
  if (up_bytes > 0)
    device_.copy_any_to_host(send_host + up_offset, static_cast<const std::byte*>(source) + up_offset,
                             up_bytes);
  staged->destination_ = operation.receive;
  staged->down_offset_ = down_offset;
  staged->down_bytes_ = down_bytes;
  return staged;
}

}  // namespace mlptrain
