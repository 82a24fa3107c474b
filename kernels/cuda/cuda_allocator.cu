// Device memory for the CUDA backend (see cuda_backend.hpp). Freed blocks are kept by size, as
// the host allocator keeps them: a training step allocates the same buffers every step, and
// cudaMalloc/cudaFree would synchronize the device each time.
#include <cuda_runtime.h>

#include <map>
#include <new>
#include <vector>

#include "kernels/cuda/cuda_backend.hpp"

namespace mlptrain {

namespace {

class CudaAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  ~CudaAllocator() override {
    for (auto& [bytes, blocks] : free_blocks_)
      for (void* block : blocks) cudaFree(block);
  }
  Device device() const override { return Device::cuda; }

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
