// Memory that charges the ledger. An Allocator hands out Buffers, each charged to one memory state
// for as long as it lives; the host allocator keeps freed blocks for reuse, so a training step
// that allocates the same activations every step costs no page faults after the first.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "core/data_type.hpp"
#include "core/memory_ledger.hpp"

namespace mlptrain {

// Where memory lives. `loopback` is host memory the host may only reach through the allocator's
// copies (see kernels/loopback/): the device path, checked on machines without a GPU.
enum class Device { cpu, cuda, loopback };

class Allocator;
class AsyncCopier;

// A block of memory owned by one holder and charged to one state. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  // Sets every byte to zero, through the allocator (the memory may be a device's).
  void fill_zero();
  bool empty() const { return data_ == nullptr; }
  std::size_t bytes() const { return bytes_; }
  MemoryState state() const { return state_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  float* floats() const { return as<float>(); }

 private:
  friend class Allocator;
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryState state_ = MemoryState::workspace;
};

class Allocator {
 public:
  explicit Allocator(MemoryLedger& ledger) : ledger_(ledger) {}
  virtual ~Allocator() = default;
  virtual Device device() const = 0;

  // Zero-byte requests give an empty buffer (an empty batch slice is legal).
  Buffer allocate(MemoryState state, std::size_t bytes);
  Buffer allocate_floats(MemoryState state, std::size_t count) {
    return allocate(state, count * sizeof(float));
  }
  Buffer allocate_elements(MemoryState state, std::size_t count, DataType type) {
    return allocate(state, count * size_of(type));
  }
  MemoryLedger& ledger() { return ledger_; }

  // The device's memory as the host sees it. Copies are ordered after the device's work so far
  // and complete before they return; on the host they are plain copies.
  virtual void zero(void* data, std::size_t bytes);
  virtual void copy_to_device(void* device, const void* host, std::size_t bytes);
  virtual void copy_to_host(void* host, const void* device, std::size_t bytes);
  // Whether `pointer` lies in device memory the host cannot read directly (never, on the host).
  virtual bool is_device_memory(const void* pointer) const;
  // Copies between host memory and memory that may lie on either side (a device's buffer, or
  // state kept in host memory such as offloaded optimizer moments).
  void copy_any_to_host(void* host, const void* source, std::size_t bytes);
  void copy_host_to_any(void* destination, const void* host, std::size_t bytes);
  // Copies that run in the background between this device's memory and host memory, in `lanes`
  // lanes, or null where copies are only synchronous (the host's memory needs none).
  virtual std::unique_ptr<AsyncCopier> make_async_copier(int /*lanes*/) { return nullptr; }

 protected:
  virtual void* obtain(std::size_t bytes) = 0;
  virtual void give_back(void* data, std::size_t bytes) = 0;

 private:
  friend class Buffer;
  void release(Buffer& buffer);
  MemoryLedger& ledger_;
};

// A device's background copies, in lanes: each lane has at most one copy each way in flight,
// waited for (or tested) by lane. Copies to the host start after all the device's work queued
// before them; copies of one direction run in the order they were started (a GPU's copy stream,
// the loopback device's copy thread), so a later copy done means every earlier one of its
// direction is done too. The host side of every copy should be page-locked memory, from
// host_memory() or another pinned allocator (on a GPU its copy engines reach only that at full
// speed). Host staging takes lanes from a pool per copy; the offloaded optimizer update one per
// piece of the state. Copies may be started, tested and ordered from another thread than the
// one starting copies to the host, one thread per lane at a time; a zero-byte copy to the host
// marks the device's work queued so far.
class AsyncCopier {
 public:
  explicit AsyncCopier(int lanes) : lanes_(lanes) {}
  virtual ~AsyncCopier() = default;
  int lanes() const { return lanes_; }
  virtual Allocator& host_memory() = 0;
  virtual void start_to_host(int lane, void* host, const void* device, std::size_t bytes) = 0;
  virtual void start_to_device(int lane, void* device, const void* host, std::size_t bytes) = 0;
  virtual void wait_to_host(int lane) = 0;
  virtual void wait_to_device(int lane) = 0;
  // Whether the lane's latest copy that way is done (true for a lane that never copied).
  virtual bool test_to_host(int lane) = 0;
  virtual bool test_to_device(int lane) = 0;
  // The device's work queued from now on runs after the lane's copy to the device. A GPU orders
  // that on its own, so the host goes on at once; elsewhere the host waits for the copy.
  virtual void order_device_after_to_device(int lane) = 0;

 protected:
  // `lane` as an index into per-lane state; one out of range is a bug, not bad input (throws).
  std::size_t lane_index(int lane) const;

 private:
  int lanes_;
};

// The bytes a cached block for a request of `bytes` is made with and kept under: requests of
// near sizes share blocks (the host's and a GPU's caching allocators alike).
std::size_t cached_block_bytes(std::size_t bytes);

// 64-byte aligned host memory, cached by size class (cached_block_bytes).
class HostAllocator : public Allocator {
 public:
  using Allocator::Allocator;
  ~HostAllocator() override;
  Device device() const override { return Device::cpu; }
  std::size_t cached_bytes() const { return cached_bytes_; }

 protected:
  void* obtain(std::size_t bytes) override;
  void give_back(void* data, std::size_t bytes) override;

 private:
  std::map<std::size_t, std::vector<void*>> free_blocks_;
  std::size_t cached_bytes_ = 0;
};

}  // namespace mlptrain
