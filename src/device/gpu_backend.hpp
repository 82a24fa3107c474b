// The GPU backend: the CUDA kernels and allocators (kernels/cuda) and the NCCL communicator
// (comm/nccl_communicator), built as one shared module, libmlptrain_gpu.so, installed beside the
// programs, that a run loads only for --device cuda. CPU runs never load CUDA's libraries:
// cuBLAS alone adds about 0.4 s to the start of every rank that links it.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

// What the module offers (kernels/cuda/cuda_backend.hpp and comm/nccl_communicator.hpp say more).
struct GpuFunctions {
  int (*device_count)(std::string* why_none);
  std::string (*device_name)(int device);
  std::int64_t (*device_memory_bytes)(int device);
  std::unique_ptr<Kernels> (*make_kernels)(int device, bool tf32);
  void* (*compute_stream)(Kernels& kernels);
  std::unique_ptr<Allocator> (*make_allocator)(MemoryLedger& ledger, void* compute_stream);
  std::unique_ptr<Allocator> (*make_pinned_allocator)(MemoryLedger& ledger);
  // Null where the module was built without NCCL.
  std::unique_ptr<Communicator> (*make_nccl_communicator)(MPI_Comm comm, std::string group, CommLedger& ledger,
                                                          void* compute_stream);
};

// The loaded module; it stays loaded while this lives (and so must outlive what it made).
class GpuBackend {
 public:
  // Loads the module from the programs' directory (else wherever the loader finds it); null,
  // with the reason in `why_not`, when this build has none or it does not load.
  static std::shared_ptr<const GpuBackend> load(std::string* why_not);
  ~GpuBackend();
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  const GpuFunctions& functions() const { return functions_; }

 private:
  GpuBackend(void* handle, const GpuFunctions& functions) : handle_(handle), functions_(functions) {}
  void* handle_;
  GpuFunctions functions_;
};

}  // namespace mlptrain
