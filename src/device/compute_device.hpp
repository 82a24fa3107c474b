// The device a run computes on, chosen by --device: its memory (charging the run's ledger), its
// kernels, the rank's communication engine, and for a device whose memory the host cannot read,
// the host staging that carries MPI communication to and from that memory; with --offload, the
// host memory and kernels that keep and update the optimizer state off the device.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>

#include "comm/comm_engine.hpp"
#include "comm/fault_injection.hpp"
#include "comm/host_staging.hpp"
#include "comm/process_groups.hpp"
#include "core/buffer.hpp"
#include "core/config.hpp"
#include "device/gpu_backend.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

// Host memory (page-locked for a GPU, so its copy engines reach it) charged to a ledger of its
// own, and the CPU's kernels to work on it.
struct HostSide {
  std::unique_ptr<Allocator> memory;
  std::unique_ptr<Kernels> kernels;
};

struct ComputeDevice {
  std::shared_ptr<const GpuBackend> gpu;  // with --device cuda; first, so that it goes last
  std::unique_ptr<Allocator> memory;
  std::unique_ptr<Kernels> kernels;
  std::unique_ptr<HostStaging> staging;  // null on the CPU
  // Runs the rank's MPI operations (after the staging, so it stops before the staging goes).
  std::unique_ptr<CommEngine> comm_engine;
  std::optional<HostSide> offload;       // with --offload
  std::string description;               // for the run's header
  double peak_tflops = 0;                // this rank's share of the device's peak (0: unknown)
  int gpus_on_node = 0;                   // with cuda: the node's GPUs, and the memory of this rank's
  std::int64_t gpu_memory_bytes = 0;
  // Host threads this rank may read samples on while it computes: its share of the node's cores,
  // less those the CPU's GEMMs use on the CPU.
  int reader_threads = 0;
};

// How the run's communicators may work (a backend setting, not a training option).
struct CommSettings {
  bool shared_memory = true;       // node-local groups run collectives in shared-memory windows
  std::optional<FaultPlan> fault;  // an operation one rank leaves out (tests of the watchdog)
};

// The groups' communicators for config.comm on `device` (an empty one, when it failed to open:
// MPI on host memory, enough to agree on the failure). MPI on the device's communication engine,
// staged through host memory off the CPU, with shared-memory windows for node-local groups
// unless the settings say otherwise; or NCCL, ordered after the device's compute stream.
CommunicatorFactory communicator_factory(const Config& config, ComputeDevice& device,
                                         CommLedger& ledger, const CommSettings& settings);

// Opens config.device for this rank of `world` (collective: with cuda, the ranks of a node
// share out its GPUs). Device memory charges `ledger`, offloaded memory `host_ledger`. Throws
// UsageError when the device cannot be had.
ComputeDevice open_compute_device(const Config& config, MPI_Comm world, MemoryLedger& ledger,
                                  MemoryLedger& host_ledger);

}  // namespace mlptrain
