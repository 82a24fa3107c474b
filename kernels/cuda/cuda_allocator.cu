// Device memory for the CUDA backend (see cuda_backend.hpp). Freed blocks are kept by size, as
// the host allocator keeps them: a training step allocates the same buffers every step, and
// cudaMalloc/cudaFree would synchronize the device each time. The host's copies and fills wait for
// all the device's work before and after them, so they are ordered with every stream without
// knowing which one wrote the memory: simple and correct, and only used off the hot path
// (samples in, routing tables, checkpoints, host-staged messages).
#include <cuda_runtime.h>

#include <map>
#include <new>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace mlptrain {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(status));
}

// Runs `operation` with the whole device idle before and after it.
template <typename Operation>
void synchronized(const char* what, Operation&& operation) {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(operation(), what);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

class CudaAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  ~CudaAllocator() override {
    for (auto& [bytes, blocks] : free_blocks_)
      for (void* block : blocks) cudaFree(block);
  }
  Device device() const override { return Device::cuda; }

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
    auto found = free_blocks_.find(bytes);
    if (found != free_blocks_.end() && !found->second.empty()) {
      void* block = found->second.back();
      found->second.pop_back();
      return block;
    }
    void* block = nullptr;
    if (cudaMalloc(&block, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      throw std::bad_alloc();
    }
    return block;
  }
  void give_back(void* data, std::size_t bytes) override { free_blocks_[bytes].push_back(data); }

 private:
  std::map<std::size_t, std::vector<void*>> free_blocks_;
};

}  // namespace

std::unique_ptr<Allocator> make_cuda_allocator(MemoryLedger& ledger) {
  return std::make_unique<CudaAllocator>(ledger);
}

}  // namespace mlptrain
