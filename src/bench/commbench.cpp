// commbench: the collectives the strategies use, timed over message sizes in the spirit of
// nccl-tests (DESIGN.md §2.6). For each element type, collective and size it runs warm-up
// iterations, times the timed ones on every rank, checks one more run's result exactly against
// values every rank can compute (commbench_case.hpp), and prints time (rank 0's, the average,
// the fastest or the slowest rank's mean, with the spread across ranks), algorithm bandwidth
// (size / time), bus bandwidth (algbw times nccl-tests' bus factor) and the count of wrong
// elements over every rank, as a table, one JSON object per measurement (--json), and a CSV
// file (--csv). The path `mpi-host` is MPI on host buffers; `mpi-staged` is MPI on device
// buffers staged through host memory (--device cuda, or loopback to check the path without a
// GPU); `nccl` is NCCL on GPU buffers, one rank per GPU. Both device paths get their
// communicator as the trainer does (compute_device.hpp). Half elements (bf16, fp16) are summed
// by the communicators themselves (fp32 sums rounded once where a backend can, pairwise
// otherwise); the inputs are small integers whose sums every format holds exactly, so every
// path is checked exactly.
#include <cstdio>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/commbench_case.hpp"
#include "bench/commbench_options.hpp"
#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "train/compute_device.hpp"

namespace {

using namespace mlptrain;

// One measurement as every rank saw it.
struct Timing {
  double reported_us = 0;  // as --report asks
  double fastest_us = 0;
  double slowest_us = 0;
  double spread_percent() const { return fastest_us > 0 ? 100.0 * (slowest_us - fastest_us) / fastest_us : 0.0; }
};

Timing across_ranks(Communicator& world, double mine_us, TimeReport report) {
  double fastest = mine_us, slowest = mine_us, total = mine_us, rank0 = world.rank() == 0 ? mine_us : 0.0;
  world.all_reduce(&fastest, 1, ReduceOp::min);
  world.all_reduce(&slowest, 1, ReduceOp::max);
  world.all_reduce(&total, 1, ReduceOp::sum);
  world.all_reduce(&rank0, 1, ReduceOp::sum);
  Timing timing{.fastest_us = fastest, .slowest_us = slowest};
  switch (report) {
    case TimeReport::rank0: timing.reported_us = rank0; break;
    case TimeReport::average: timing.reported_us = total / world.size(); break;
    case TimeReport::minimum: timing.reported_us = fastest; break;
    case TimeReport::maximum: timing.reported_us = slowest; break;
  }
  return timing;
}

const char* const csv_header =
    "collective,path,device,dtype,ranks,bytes,time_us,time_report,time_min_us,time_max_us,algbw_gbps,busbw_gbps,"
    "wrong\n";

void measure(const CommbenchSettings& settings, Communicator& world, Allocator* device) {
  const int rank = world.rank();
  const std::string device_name = device != nullptr ? settings.device : "cpu";
  const std::string report(time_report_name(settings.report));
  std::ofstream csv;
  if (rank == 0 && !settings.csv_path.empty()) {
    csv.open(settings.csv_path);
    if (csv) csv << csv_header;
  }
  agree_or_throw(world, [&] {
    if (rank == 0 && !settings.csv_path.empty() && !csv)
      throw UsageError(fmt::format("--csv: cannot write '{}'", settings.csv_path));
  });
  if (rank == 0 && !settings.json) {
    std::printf("# commbench: path %s%s, %d rank(s), %d iterations after %d warm-up, time: %s over ranks\n",
                settings.path.c_str(), device != nullptr ? (" on " + settings.device).c_str() : "", world.size(),
                settings.iterations, settings.warmup, report.c_str());
    std::printf("# %-15s %5s %12s %12s %9s %12s %12s %8s\n", "collective", "type", "bytes", "time_us", "spread_%",
                "algbw_GB/s", "busbw_GB/s", "#wrong");
  }
  std::int64_t wrong_measurements = 0;
  const std::unique_ptr<AsyncCopier> copier = device != nullptr ? device->make_async_copier(1) : nullptr;
  for (const DataType dtype : settings.dtypes) {
    const std::string type_name(data_type_name(dtype));
    for (const std::string& collective : settings.collectives) {
      for (std::int64_t size = settings.min_bytes; size <= settings.max_bytes; size *= settings.step_factor) {
        CollectiveCase current(collective, size, dtype, world, device, copier.get());
        if (current.empty()) continue;  // smaller than one element per rank
        current.fill();
        for (int iteration = 0; iteration < settings.warmup; ++iteration) current.run();
        world.barrier();
        const double start_ms = now_ms();
        for (int iteration = 0; iteration < settings.iterations; ++iteration) current.run();
        const Timing timing =
            across_ranks(world, (now_ms() - start_ms) * 1000.0 / settings.iterations, settings.report);
        current.fill();
        current.run();
        auto wrong = static_cast<std::int64_t>(current.wrong_elements());
        world.all_reduce(&wrong, 1, ReduceOp::sum);
        wrong_measurements += wrong > 0;
        const double algbw = static_cast<double>(current.bytes()) / (timing.reported_us * 1e3);  // GB/s
        const double busbw = algbw * current.bus_factor();
        if (rank != 0) continue;
        if (settings.json) {
          nlohmann::json row = {{"collective", collective}, {"path", settings.path}, {"device", device_name},
                                {"dtype", type_name}, {"bytes", current.bytes()}, {"ranks", world.size()},
                                {"time_us", timing.reported_us}, {"time_report", report},
                                {"time_min_us", timing.fastest_us}, {"time_max_us", timing.slowest_us},
                                {"algbw_gbps", algbw}, {"busbw_gbps", busbw}, {"wrong", wrong},
                                {"correct", wrong == 0}};
          if (settings.path == "mpi-staged") row["chunk_bytes"] = settings.chunk_bytes;
          std::printf("%s\n", row.dump().c_str());
        } else {
          std::printf("  %-15s %5s %12lld %12.2f %9.1f %12.3f %12.3f %8lld\n", collective.c_str(), type_name.c_str(),
                      static_cast<long long>(current.bytes()), timing.reported_us, timing.spread_percent(), algbw,
                      busbw, static_cast<long long>(wrong));
        }
        if (csv)
          csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", collective, settings.path, device_name,
                             type_name, world.size(), current.bytes(), timing.reported_us, report, timing.fastest_us,
                             timing.slowest_us, algbw, busbw, wrong);
        std::fflush(stdout);
      }
    }
  }
  if (wrong_measurements > 0)
    throw AgreedError(ExitCode::runtime_failure,
                      fmt::format("{} measurement(s) gave wrong results", wrong_measurements));
}

}  // namespace

int main(int argc, char** argv) {
  // Plain host buffers: MPI's own collectives, not the shared-memory window of collective memory.
  return run_mpi_program(argc, argv, "commbench", [&](MpiCommunicator& world) {
    CommbenchSettings settings;
    agree_or_throw(world, [&] { settings = parse_commbench_options(argc, argv); });
    if (settings.help) {
      if (world.rank() == 0) std::fputs(settings.help_text.c_str(), stdout);
    } else if (settings.path == "mpi-host") {
      measure(settings, world, nullptr);
    } else {
      // Device buffers on a communicator of their own: MPI staging them through host memory, or
      // NCCL.
      Config config;
      config.device = settings.device == "cuda" ? Device::cuda : Device::loopback;
      config.comm = settings.path == "nccl" ? CommBackend::nccl : CommBackend::mpi;
      MemoryLedger memory, host_memory;
      CommLedger ledger;
      ComputeDevice device;
      std::unique_ptr<Communicator> communicator;
      agree_or_throw(world, [&] {
        device = open_compute_device(config, MPI_COMM_WORLD, memory, host_memory);
        if (device.staging)
          device.staging = std::make_unique<HostStaging>(
              *device.memory, settings.chunk_bytes > 0 ? static_cast<std::size_t>(settings.chunk_bytes)
                                                       : std::numeric_limits<std::size_t>::max());
      });
      agree_or_throw(world, [&] {
        MPI_Comm comm = MPI_COMM_NULL;
        MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        communicator = communicator_factory(config, device, ledger, {.shared_memory = false})(comm, "world");
      });
      measure(settings, *communicator, device.memory.get());
    }
  });
}
