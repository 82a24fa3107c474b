// The CUDA backend (built whenever nvcc is present): the kernel interface on one GPU, and device
// memory that charges the memory ledger. Plain C++ here, so callers need no CUDA headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

// GPUs this process can use; 0 with the reason in `why_none` (no driver, no device) otherwise.
int cuda_device_count(std::string* why_none = nullptr);

// The GPU's model name as the driver reports it ("NVIDIA H100 80GB HBM3"), and its memory.
std::string cuda_device_name(int device);
std::int64_t cuda_device_memory_bytes(int device);

// The kernels on `device` (the caller picks it, e.g. local rank modulo the GPUs present), on a
// compute stream of their own. GEMMs are fp32; `tf32` lets cuBLAS use TF32 tensor cores.
std::unique_ptr<Kernels> make_cuda_kernels(int device, bool tf32 = false);

// The compute stream (a cudaStream_t) of kernels made by make_cuda_kernels; null for others.
// Communication on its own stream orders itself after the work queued there.
void* cuda_compute_stream(Kernels& kernels);

// Device memory from cudaMalloc on the current device, freed blocks cached by size for reuse.
// Its background copies (make_async_copier, for host staging) wait for `compute_stream`'s work.
std::unique_ptr<Allocator> make_cuda_allocator(MemoryLedger& ledger, void* compute_stream);

// Page-locked host memory (cudaHostAlloc), which the GPU's copy engines reach directly: host
// memory to the rest of the program (device() is cpu), cached by size like the others.
std::unique_ptr<Allocator> make_cuda_pinned_allocator(MemoryLedger& ledger);

}  // namespace mlptrain
