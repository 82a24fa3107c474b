// The GPU backend module's entry point (see gpu_backend.hpp): compiled into libmlptrain_gpu.so
// only, with the CUDA kernels and the NCCL communicator; everything else it uses (the kernel and
// communicator interfaces, the ledgers) it finds in the program that loads it.
#include "comm/nccl_communicator.hpp"
#include "device/gpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"

extern "C" const mlptrain::GpuFunctions* mlptrain_gpu_functions() {
  using namespace mlptrain;
  static const GpuFunctions functions{
      .device_count = cuda_device_count,
      .device_name = cuda_device_name,
      .device_memory_bytes = cuda_device_memory_bytes,
      .make_kernels = make_cuda_kernels,
      .compute_stream = cuda_compute_stream,
      .make_allocator = make_cuda_allocator,
      .make_pinned_allocator = make_cuda_pinned_allocator,
      .make_nccl_communicator = nccl_backend_built() ? make_nccl_communicator : nullptr};
  return &functions;
}
