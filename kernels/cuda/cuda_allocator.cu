// Device memory and page-locked host memory for the CUDA backend (see cuda_backend.hpp). Freed
// blocks are kept by size, as the host allocator keeps them. The host's copies and fills wait for
// all the device's work before and after them, so they are ordered with every stream without
// knowing which one wrote the memory: simple and correct, and only used off the hot path
// (samples in, routing tables, checkpoints, host-staged messages).
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <vector>
#include <new>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain {

namespace {

// Runs `operation` with the whole device idle before and after it.
template <typename Operation>
void synchronized(const char* what, Operation&& operation) {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(operation(), what);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Freed blocks kept by size class for reuse: a training step allocates the same buffers every
// step (an MoE layer's of sizes near last step's), and CUDA's allocation calls are slow and
// synchronize the device.
class BlockCache {
 public:
  explicit BlockCache(cudaError_t (*free_block)(void*)) : free_block_(free_block) {}
  ~BlockCache() {
    for (auto& [bytes, blocks] : blocks_)
      for (void* block : blocks) free_block_(block);
  }
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  // A kept block of `bytes`' size class (cached_block_bytes), or null.
  void* take(std::size_t bytes) {
    auto found = blocks_.find(cached_block_bytes(bytes));
    if (found == blocks_.end() || found->second.empty()) return nullptr;
    void* block = found->second.back();
    found->second.pop_back();
    return block;
  }
  void keep(void* block, std::size_t bytes) { blocks_[cached_block_bytes(bytes)].push_back(block); }

 private:
  cudaError_t (*free_block_)(void*);
  std::map<std::size_t, std::vector<void*>> blocks_;
};

// A block from the cache, else from `allocate` at its size class's bytes; a failed allocation
// is std::bad_alloc.
template <typename Allocate>
void* cached_or_new(BlockCache& cache, std::size_t bytes, Allocate&& allocate) {
  if (void* block = cache.take(bytes)) return block;
  void* block = nullptr;
  if (allocate(&block, cached_block_bytes(bytes)) != cudaSuccess) {
    cudaGetLastError();  // clear the error state a failed allocation leaves
    throw std::bad_alloc();
  }
  return block;
}

// Page-locked host memory: host memory to the rest of the program, which the GPU's copy engines
// reach without a bounce through pageable memory.
class PinnedHostAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  Device device() const override { return Device::cpu; }

 protected:
  void* obtain(std::size_t bytes) override {
    return cached_or_new(cache_, bytes, [](void** block, std::size_t size) {
      return cudaHostAlloc(block, size, cudaHostAllocDefault);
    });
  }
  void give_back(void* data, std::size_t bytes) override { cache_.keep(data, bytes); }

 private:
  BlockCache cache_{cudaFreeHost};
};

// Background copies on two copy streams (down and up, so a chunk going down overlaps one coming
// up), one event per lane and direction. A copy to the host first waits, on the GPU, for the
// compute stream's work so far: the kernels that wrote the data.
class CudaCopier final : public AsyncCopier {
 public:
  CudaCopier(int lanes, cudaStream_t compute_stream)
      : AsyncCopier(lanes),
        compute_stream_(compute_stream),
        to_host_(static_cast<std::size_t>(lanes)),
        to_device_(to_host_.size()) {
    check(cudaGetDevice(&device_), "cudaGetDevice");
    check(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (auto* events : {&to_host_, &to_device_})
      for (cudaEvent_t& event : *events)
        check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaCopier() override {
    cudaStreamSynchronize(down_);
    cudaStreamSynchronize(up_);
    for (auto* events : {&to_host_, &to_device_})
      for (cudaEvent_t event : *events) cudaEventDestroy(event);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(down_);
    cudaStreamDestroy(up_);
  }
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  Allocator& host_memory() override { return pinned_; }
  void start_to_host(int lane, void* host, const void* device, std::size_t bytes) override {
    bind_thread();
    check(cudaEventRecord(ready_, compute_stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(down_, ready_, 0), "cudaStreamWaitEvent");
    // A zero-byte copy only marks the compute stream's work so far.
    if (bytes > 0) check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, down_), "cudaMemcpyAsync");
    check(cudaEventRecord(to_host_[lane_index(lane)], down_), "cudaEventRecord");
  }
  void start_to_device(int lane, void* device, const void* host, std::size_t bytes) override {
    bind_thread();
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, up_), "cudaMemcpyAsync");
    check(cudaEventRecord(to_device_[lane_index(lane)], up_), "cudaEventRecord");
  }
  void wait_to_host(int lane) override {
    check(cudaEventSynchronize(to_host_[lane_index(lane)]), "cudaEventSynchronize");
  }
  void wait_to_device(int lane) override {
    check(cudaEventSynchronize(to_device_[lane_index(lane)]), "cudaEventSynchronize");
  }
  bool test_to_host(int lane) override { return done(to_host_[lane_index(lane)]); }
  bool test_to_device(int lane) override { return done(to_device_[lane_index(lane)]); }
  void order_device_after_to_device(int lane) override {
    bind_thread();
    check(cudaStreamWaitEvent(compute_stream_, to_device_[lane_index(lane)], 0), "cudaStreamWaitEvent");
  }

 private:
  // The calling thread's current device is the copier's (a thread of its own starts on device 0).
  void bind_thread() const { check(cudaSetDevice(device_), "cudaSetDevice"); }
  // An event never recorded counts as done, as cudaEventQuery says.
  static bool done(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    check(status, "cudaEventQuery");
    return true;
  }

  int device_ = 0;
  cudaStream_t compute_stream_;
  cudaStream_t down_ = nullptr, up_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::vector<cudaEvent_t> to_host_, to_device_;
  MemoryLedger ledger_;  // staging memory is the host's, not the device's
  PinnedHostAllocator pinned_{ledger_};
};

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator(MemoryLedger& ledger, cudaStream_t compute_stream)
      : Allocator(ledger), compute_stream_(compute_stream) {}
  Device device() const override { return Device::cuda; }
  std::unique_ptr<AsyncCopier> make_async_copier(int lanes) override {
    return std::make_unique<CudaCopier>(lanes, compute_stream_);
  }

  void zero(void* data, std::size_t bytes) override {
    if (bytes > 0) synchronized("cudaMemset", [&] { return cudaMemset(data, 0, bytes); });
  }
  void copy_to_device(void* device, const void* host, std::size_t bytes) override {
    if (bytes > 0)
      synchronized("cudaMemcpy", [&] { return cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice); });
  }
  void copy_to_host(void* host, const void* device, std::size_t bytes) override {
    if (bytes > 0)
      synchronized("cudaMemcpy", [&] { return cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost); });
  }
  bool is_device_memory(const void* pointer) const override {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      cudaGetLastError();  // not a pointer CUDA knows: host memory
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice;
  }

 protected:
  void* obtain(std::size_t bytes) override {
    return cached_or_new(cache_, bytes,
                         [](void** block, std::size_t size) { return cudaMalloc(block, size); });
  }
  void give_back(void* data, std::size_t bytes) override { cache_.keep(data, bytes); }

 private:
  cudaStream_t compute_stream_;
  BlockCache cache_{cudaFree};
};

}  // namespace

std::unique_ptr<Allocator> make_cuda_pinned_allocator(MemoryLedger& ledger) {
  return std::make_unique<PinnedHostAllocator>(ledger);
}

std::unique_ptr<Allocator> make_cuda_allocator(MemoryLedger& ledger, void* compute_stream) {
  return std::make_unique<CudaAllocator>(ledger, static_cast<cudaStream_t>(compute_stream));
}

}  // namespace mlptrain
