// Opening the run's compute device (see compute_device.hpp).
#include "device/compute_device.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>

#include "comm/gpu_placement.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "device/device_peaks.hpp"
#include "kernels/loopback/loopback_backend.hpp"

namespace mlptrain {

namespace {

ComputeDevice open_cuda(const Config& config, MPI_Comm world, MemoryLedger& ledger, MemoryLedger& host_ledger) {
  std::string why_none;
  ComputeDevice device;
  device.gpu = GpuBackend::load(&why_none);
  const GpuFunctions* gpu = device.gpu ? &device.gpu->functions() : nullptr;
  const int gpus = gpu != nullptr ? gpu->device_count(&why_none) : 0;
  const NodePlace place = node_place(world);
  if (gpus == 0) throw UsageError("--device cuda: no GPU is usable here (" + why_none + ")");
  const int chosen = choose_gpu(place, gpus, config.device.comm == CommBackend::nccl);
  device.kernels = gpu->make_kernels(chosen, config.device.tf32);
  device.memory = gpu->make_allocator(ledger, gpu->compute_stream(*device.kernels));
  device.staging = std::make_unique<HostStaging>(*device.memory);
  if (config.device.offload) device.offload = HostSide{gpu->make_pinned_allocator(host_ledger), make_cpu_kernels()};
  const std::string name = gpu->device_name(chosen);
  device.gpus_on_node = gpus;
  device.gpu_memory_bytes = gpu->device_memory_bytes(chosen);
  // bf16 and fp16 parameters run their GEMMs on the tensor cores' half-precision path.
  const bool half = config.precision.param_dtype == DataType::bfloat16 || config.precision.param_dtype == DataType::float16;
  const GemmMath math = half ? GemmMath::half : config.device.tf32 ? GemmMath::tf32 : GemmMath::fp32;
  device.description = fmt::format("GPU {} of {} on this node ({}, {} rank(s) here), GEMMs in {}", chosen, gpus,
                                   name, place.local_ranks,
                                   half ? data_type_name(config.precision.param_dtype) : config.device.tf32 ? "TF32" : "fp32");
  // Ranks that share a GPU share its peak.
  const int sharing = (place.local_ranks + gpus - 1) / gpus;
  if (const auto peak = known_peak_tflops(name, math))
    device.peak_tflops = *peak / sharing;
  return device;
}

// The rank's share of the cores it may run on: ranks on one node split them evenly.
int cpu_share(MPI_Comm world) {
  cpu_set_t allowed;
  const int cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
  return std::max(1, cores / node_place(world).local_ranks);
}

}  // namespace

ComputeDevice open_compute_device(const Config& config, MPI_Comm world, MemoryLedger& ledger,
                                  MemoryLedger& host_ledger) {
  // The CPU's GEMMs (the trainer's, or the host side's of a GPU run) use the rank's cores.
  const int host_threads = cpu_share(world);
  const int gemm_threads = set_cpu_gemm_threads(host_threads);
  ComputeDevice device;
  if (config.device.kind == Device::cuda) {
    device = open_cuda(config, world, ledger, host_ledger);
  } else if (config.device.kind == Device::loopback) {
    device.memory = make_loopback_allocator(ledger);
    device.kernels = make_loopback_kernels();
    device.staging = std::make_unique<HostStaging>(*device.memory);
    if (config.device.offload)
      device.offload = HostSide{std::make_unique<HostAllocator>(host_ledger), make_cpu_kernels()};
    device.description = "the CPU behind loopback device memory (every host-device copy explicit)";
  } else {
    device.memory = std::make_unique<HostAllocator>(ledger);
    device.kernels = make_cpu_kernels();
    device.description = "CPU";
  }
  device.reader_threads = config.device.kind == Device::cpu ? std::max(0, host_threads - gemm_threads) : host_threads;
  device.comm_engine = std::make_unique<CommEngine>();
  return device;
}

CommunicatorFactory communicator_factory(const Config& config, ComputeDevice& device,
                                         CommLedger& ledger, const CommSettings& settings) {
  CommunicatorFactory make;
  if (config.device.comm == CommBackend::nccl && device.gpu && device.kernels != nullptr) {
    const GpuFunctions& gpu = device.gpu->functions();
    if (gpu.make_nccl_communicator == nullptr)
      throw UsageError("--comm nccl: this build has no NCCL backend (nccl.h was not found beside nvcc when it was "
                       "configured)");
    void* compute_stream = gpu.compute_stream(*device.kernels);
    make = [&ledger, compute_stream, create = gpu.make_nccl_communicator](MPI_Comm comm, std::string group) {
      return create(comm, std::move(group), ledger, compute_stream);
    };
  }
  if (!make) {
    HostStaging* staging = device.staging.get();
    CommEngine* engine = device.comm_engine.get();
    make = [&ledger, shared_memory = settings.shared_memory, engine, staging](
               MPI_Comm comm, std::string group) -> std::unique_ptr<Communicator> {
      return std::make_unique<MpiCommunicator>(comm, std::move(group), ledger, shared_memory, engine, staging);
    };
  }
  if (!settings.fault) return make;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  return [make, world_rank, fault = *settings.fault](MPI_Comm comm, std::string group) {
    return with_fault(make(comm, std::move(group)), world_rank, fault);
  };
}

}  // namespace mlptrain
