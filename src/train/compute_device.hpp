// The device a run computes on, chosen by --device: its memory (charging the run's ledger), its
// kernels, and for a device whose memory the host cannot read, the host staging that carries
// MPI communication to and from that memory.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/host_staging.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

struct ComputeDevice {
  std::unique_ptr<Allocator> memory;
  std::unique_ptr<Kernels> kernels;
  std::unique_ptr<HostStaging> staging;  // null on the CPU
  std::string description;               // for the run's header
};

// Whether this build has the CUDA backend (nvcc was present when it was configured).
bool cuda_backend_built();

// Opens config.device for this rank of `world` (collective: with cuda, the ranks of a node
// share out its GPUs). Throws UsageError when the device cannot be had.
ComputeDevice open_compute_device(const Config& config, MPI_Comm world, MemoryLedger& ledger);

}  // namespace mlptrain
