// Buffers and allocators (see buffer.hpp).
#include "core/buffer.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace mlptrain {

namespace {
constexpr std::size_t alignment_bytes = 64;
}  // namespace

std::size_t cached_block_bytes(std::size_t bytes) {
  // Large blocks: eight classes per doubling (an eighth of the size's power of two, at least a
  // page), so a block wastes under 1/8 of what it holds. Sizes that follow the routing (an MoE
  // layer's exchanged rows) fall into a few classes instead of one per row count: with a class
  // per page, every step's new row counts made new blocks, which the cache kept for ever.
  const std::size_t granule =
      bytes >= 65536 ? std::max<std::size_t>(4096, std::bit_floor(bytes) / 8) : alignment_bytes;
  return (bytes + granule - 1) / granule * granule;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    allocator_ = other.allocator_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    state_ = other.state_;
    other.allocator_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->release(*this);
  allocator_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void Buffer::fill_zero() {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->zero(data_, bytes_);
}

Buffer Allocator::allocate(MemoryState state, std::size_t bytes) {
  Buffer buffer;
  if (bytes == 0) return buffer;
  buffer.data_ = obtain(bytes);
  buffer.allocator_ = this;
  buffer.bytes_ = bytes;
  buffer.state_ = state;
  ledger_.charge(state, bytes);
  return buffer;
}

void Allocator::release(Buffer& buffer) {
  ledger_.release(buffer.state_, buffer.bytes_);
  give_back(buffer.data_, buffer.bytes_);
}

void Allocator::zero(void* data, std::size_t bytes) {
  if (bytes > 0) std::memset(data, 0, bytes);
}

void Allocator::copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}

void Allocator::copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}

bool Allocator::is_device_memory(const void*) const { return false; }

void Allocator::copy_any_to_host(void* host, const void* source, std::size_t bytes) {
  if (is_device_memory(source)) {
    copy_to_host(host, source, bytes);
  } else if (bytes > 0) {
    std::memcpy(host, source, bytes);
  }
}

void Allocator::copy_host_to_any(void* destination, const void* host, std::size_t bytes) {
  if (is_device_memory(destination)) {
    copy_to_device(destination, host, bytes);
  } else if (bytes > 0) {
    std::memcpy(destination, host, bytes);
  }
}

std::size_t AsyncCopier::lane_index(int lane) const {
  if (lane < 0 || lane >= lanes_) throw std::out_of_range("asynchronous copy lane out of range");
  return static_cast<std::size_t>(lane);
}

HostAllocator::~HostAllocator() {
  for (auto& [size, blocks] : free_blocks_)
    for (void* block : blocks) std::free(block);
}

void* HostAllocator::obtain(std::size_t bytes) {
  const std::size_t size = cached_block_bytes(bytes);
  auto found = free_blocks_.find(size);
  if (found != free_blocks_.end() && !found->second.empty()) {
    void* block = found->second.back();
    found->second.pop_back();
    cached_bytes_ -= size;
    return block;
  }
  // Large blocks start on a page, so whole pages of them can go to a file around the page cache
  // (a checkpoint's writes, O_DIRECT).
  void* block = std::aligned_alloc(size >= 65536 ? 4096 : alignment_bytes, size);
  if (block == nullptr) throw std::bad_alloc();
  return block;
}

void HostAllocator::give_back(void* data, std::size_t bytes) {
  const std::size_t size = cached_block_bytes(bytes);
  free_blocks_[size].push_back(data);
  cached_bytes_ += size;
}

}  // namespace mlptrain
