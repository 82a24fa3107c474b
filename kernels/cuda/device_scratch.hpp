// Device memory a kernel backend borrows for the span of one operation, kept and grown as needed
// on its stream (which orders its uses): a biased GEMM's fp32 sums where no epilogue adds the
// bias, column sums' partials, the sample generator's spare inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain {

class DeviceScratch {
 public:
  explicit DeviceScratch(cudaStream_t stream) : stream_(stream) {}
  ~DeviceScratch() {
    if (memory_ != nullptr) cudaFreeAsync(memory_, stream_);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `bytes` (the same block while it is large enough).
  void* reserve(std::size_t bytes) {
    if (bytes > bytes_) {
      if (memory_ != nullptr) check(cudaFreeAsync(memory_, stream_), "cudaFreeAsync");
      memory_ = nullptr;  // nothing held should the allocation fail
      bytes_ = 0;
      check(cudaMallocAsync(&memory_, bytes, stream_), "cudaMallocAsync");
      bytes_ = bytes;
    }
    return memory_;
  }

 private:
  cudaStream_t stream_;
  void* memory_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace mlptrain
