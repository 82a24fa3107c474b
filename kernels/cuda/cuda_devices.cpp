// The GPUs this process sees, their names and memory (see cuda_backend.hpp): what a run's header,
// the GPU choice of each rank and layerbench's rows for the planner read.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain {

int cuda_device_count(std::string* why_none) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (why_none != nullptr) *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device is present";
  return count;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

std::int64_t cuda_device_memory_bytes(int device) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return static_cast<std::int64_t>(properties.totalGlobalMem);
}

}  // namespace mlptrain
