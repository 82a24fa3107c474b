// commbench: the collectives the strategies use, timed over message sizes in the spirit of
// nccl-tests (DESIGN.md §2.6). For each element type, collective and size it runs warm-up
// iterations, times the timed ones on every rank, checks one more run's result against
// values every rank can compute (commbench_case.hpp), and prints time (rank 0's, the average,
// the fastest or the slowest rank's mean, with the spread across ranks), algorithm bandwidth
// (size / time), bus bandwidth (algbw times nccl-tests' bus factor) and the count of wrong
// elements over every rank, as a table, one JSON object per measurement (--json), and a CSV
// file (--csv). The path `mpi-host` is MPI on host buffers; `mpi-staged` is MPI on device
// buffers staged through host memory (--device cuda, or loopback to check the path without a
// GPU); `nccl` is NCCL on GPU buffers, one rank per GPU. Both device paths get their
// communicator as the trainer does (device/compute_device.hpp). Half elements (bf16, fp16) are summed
// by the communicators themselves (fp32 sums rounded once where a backend can, pairwise
// otherwise): their sums are held within a bound derived from the format, every other result
// exactly (commbench_case.hpp).
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench/commbench_case.hpp"
#include "bench/commbench_options.hpp"
#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "device/compute_device.hpp"

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

// One measurement of one case: time across ranks, bandwidths, wrong elements over every rank.
struct Measurement {
  Timing timing;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::int64_t wrong = 0;
  double max_error = 0;    // over every rank's checked elements
  double error_bound = 0;  // the largest allowed (0: exact)
};

Measurement measure_case(CollectiveCase& current, Communicator& world, const CommbenchSettings& settings,
                         Issue issue, double compute_us = 0) {
  current.fill();
  for (int iteration = 0; iteration < settings.warmup; ++iteration) current.run(issue, compute_us);
  world.barrier();
  const double start_ms = now_ms();
  for (int iteration = 0; iteration < settings.iterations; ++iteration) current.run(issue, compute_us);
  Measurement result;
  result.timing = across_ranks(world, (now_ms() - start_ms) * 1000.0 / settings.iterations, settings.report);
  current.fill();
  current.run(issue);
  result.wrong = static_cast<std::int64_t>(current.wrong_elements());
  world.all_reduce(&result.wrong, 1, ReduceOp::sum);
  double errors[2] = {current.max_error(), current.error_bound()};
  world.all_reduce(errors, 2, ReduceOp::max);
  result.max_error = errors[0];
  result.error_bound = errors[1];
  result.algbw_gbps = static_cast<double>(current.bytes()) / (result.timing.reported_us * 1e3);  // GB/s
  result.busbw_gbps = result.algbw_gbps * current.bus_factor();
  return result;
}

// The JSON rows' fields, one column each (chunk_bytes and the in-place group empty where the row
// has none).
const char* const csv_header =
    "collective,path,device,dtype,issue,ranks,bytes,chunk_bytes,time_us,time_report,time_min_us,time_max_us,algbw_gbps,"
    "busbw_gbps,wrong,max_error,error_bound,correct,in_place_time_us,in_place_algbw_gbps,in_place_busbw_gbps,"
    "in_place_wrong,compute_us,overlap_time_us,hidden_fraction\n";

// A started operation timed beside the host's computation: how much of it the computation hid.
struct Overlap {
  double compute_us = 0;  // the host's loop, as long as the operation took alone
  double time_us = 0;     // start, compute, wait
  // 1: the operation cost nothing beyond the computation; 0: nothing of it ran meanwhile.
  double hidden_fraction() const { return std::clamp((2 * compute_us - time_us) / compute_us, 0.0, 1.0); }
};

// The textbook identity: an all-reduce costs what a reduce-scatter and an all-gather of the same
// size cost (both move 2(n-1)/n of the buffer per rank). Printed per size where all three ran.
void print_identity(const CommbenchSettings& settings, const std::string& type_name, int ranks,
                    const std::map<std::pair<std::string, std::int64_t>, double>& times_us) {
  bool header = false;
  for (const auto& [key, all_reduce_us] : times_us) {
    if (key.first != "all_reduce") continue;
    const auto scatter = times_us.find({"reduce_scatter", key.second});
    const auto gather = times_us.find({"all_gather", key.second});
    if (scatter == times_us.end() || gather == times_us.end()) continue;
    const double parts_us = scatter->second + gather->second;
    if (settings.json) {
      const nlohmann::json row = {{"collective", "identity"}, {"path", settings.path}, {"dtype", type_name},
                                  {"ranks", ranks}, {"bytes", key.second}, {"all_reduce_us", all_reduce_us},
                                  {"reduce_scatter_plus_all_gather_us", parts_us},
                                  {"ratio", all_reduce_us / parts_us}};
      std::printf("%s\n", row.dump().c_str());
      continue;
    }
    if (!header)
      std::printf("# identity (%s): all_reduce against reduce_scatter + all_gather of the same size\n"
                  "# %12s %14s %14s %8s\n",
                  type_name.c_str(), "bytes", "all_reduce_us", "rs+ag_us", "ratio");
    header = true;
    std::printf("  %12lld %14.2f %14.2f %8.3f\n", static_cast<long long>(key.second), all_reduce_us, parts_us,
                all_reduce_us / parts_us);
  }
}

// One row of results: a collective at one size, type and way of issue.
struct Row {
  std::string collective, type_name;
  Issue issue = Issue::blocking;
  std::int64_t bytes = 0;
  Measurement out;
  std::optional<Measurement> in;  // where the collective has an in-place form
  std::optional<Overlap> overlap;  // started, with --overlap
};

// Prints a row (rank 0) as a table line or a JSON object, and as a CSV line.
void report_row(const CommbenchSettings& settings, const Row& row, int ranks, const std::string& device_name,
                std::ofstream& csv) {
  const Measurement& out = row.out;
  const std::optional<Measurement>& in = row.in;
  const std::string report(time_report_name(settings.report)), issue(issue_name(row.issue));
  const bool correct = out.wrong == 0 && (!in || in->wrong == 0);
  const bool staged = settings.path == "mpi-staged";
  if (settings.json) {
    nlohmann::json json = {{"collective", row.collective}, {"path", settings.path}, {"device", device_name},
                           {"dtype", row.type_name}, {"issue", issue}, {"bytes", row.bytes}, {"ranks", ranks},
                           {"time_us", out.timing.reported_us}, {"time_report", report},
                           {"time_min_us", out.timing.fastest_us}, {"time_max_us", out.timing.slowest_us},
                           {"algbw_gbps", out.algbw_gbps}, {"busbw_gbps", out.busbw_gbps},
                           {"wrong", out.wrong}, {"max_error", out.max_error},
                           {"error_bound", out.error_bound},
                           {"correct", correct}};
    if (in) {
      json["in_place_time_us"] = in->timing.reported_us;
      json["in_place_algbw_gbps"] = in->algbw_gbps;
      json["in_place_busbw_gbps"] = in->busbw_gbps;
      json["in_place_wrong"] = in->wrong;
    }
    if (staged) json["chunk_bytes"] = settings.chunk_bytes;
    if (row.overlap) {
      json["compute_us"] = row.overlap->compute_us;
      json["overlap_time_us"] = row.overlap->time_us;
      json["hidden_fraction"] = row.overlap->hidden_fraction();
    }
    std::printf("%s\n", json.dump().c_str());
  } else {
    const std::string in_place_columns =
        in ? fmt::format("{:10.2f} {:8.3f} {:8.3f} {:9d}", in->timing.reported_us, in->algbw_gbps, in->busbw_gbps,
                         in->wrong)
           : fmt::format("{:>10} {:>8} {:>8} {:>9}", "-", "-", "-", "-");
    const std::string overlap_column = row.overlap ? fmt::format(" | {:6.2f}", row.overlap->hidden_fraction()) : "";
    std::printf("  %-15s %5s %8s %12lld %10.2f %8.1f %8.3f %8.3f %6lld | %s%s\n", row.collective.c_str(),
                row.type_name.c_str(), issue.c_str(), static_cast<long long>(row.bytes), out.timing.reported_us,
                out.timing.spread_percent(), out.algbw_gbps, out.busbw_gbps, static_cast<long long>(out.wrong),
                in_place_columns.c_str(), overlap_column.c_str());
  }
  if (csv) {
    csv << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}", row.collective, settings.path,
                       device_name, row.type_name, issue, ranks, row.bytes,
                       staged ? std::to_string(settings.chunk_bytes) : std::string(), out.timing.reported_us, report,
                       out.timing.fastest_us, out.timing.slowest_us, out.algbw_gbps, out.busbw_gbps, out.wrong,
                       out.max_error, out.error_bound, correct ? "true" : "false");
    csv << (in ? fmt::format(",{},{},{},{}", in->timing.reported_us, in->algbw_gbps, in->busbw_gbps, in->wrong)
               : std::string(",,,,"));
    csv << (row.overlap ? fmt::format(",{},{},{}\n", row.overlap->compute_us, row.overlap->time_us,
                                      row.overlap->hidden_fraction())
                        : std::string(",,,\n"));
  }
  std::fflush(stdout);
}

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
    // Out of place, then in place (ip_), as nccl-tests' two column groups: algorithm bandwidth
    // (bytes / time) and bus bandwidth (that times the collective's bus factor) in GB/s.
    // With --overlap, started rows end with the fraction of the operation the host's computation hid.
    std::printf("# %-15s %5s %8s %12s %10s %8s %8s %8s %6s | %10s %8s %8s %9s%s\n", "collective", "type", "issue",
                "bytes", "time_us", "spread_%", "algbw", "busbw", "#wrong", "ip_time_us", "ip_algbw", "ip_busbw",
                "ip_#wrong", settings.overlap ? " | hidden" : "");
  }
  std::int64_t wrong_measurements = 0;
  const std::unique_ptr<AsyncCopier> copier = device != nullptr ? device->make_async_copier(1) : nullptr;
  for (const DataType dtype : settings.dtypes) {
    const std::string type_name(data_type_name(dtype));
    std::map<std::pair<std::string, std::int64_t>, double> times_us;  // out of place, for the identity
    for (const std::string& collective : settings.collectives) {
      for (std::int64_t size = settings.min_bytes; size <= settings.max_bytes; size *= settings.step_factor) {
        for (const Issue issue : settings.issues) {
          if (issue == Issue::started && !CollectiveCase::can_start(collective)) continue;
          CollectiveCase apart(collective, size, dtype, false, world, MPI_COMM_WORLD, device, copier.get());
          if (apart.empty()) continue;  // smaller than one element per rank
          Row row{.collective = collective, .type_name = type_name, .issue = issue, .bytes = apart.bytes(),
                  .out = measure_case(apart, world, settings, issue)};
          if (CollectiveCase::has_in_place(collective)) {
            CollectiveCase together(collective, size, dtype, true, world, MPI_COMM_WORLD, device, copier.get());
            row.in = measure_case(together, world, settings, issue);
          }
          if (issue == Issue::started && settings.overlap) {
            // Every rank computes as long as the slowest took alone (the reported time).
            const double compute_us = row.out.timing.reported_us;
            row.overlap = Overlap{compute_us, measure_case(apart, world, settings, issue, compute_us).timing.reported_us};
          }
          wrong_measurements += (row.out.wrong > 0) + (row.in && row.in->wrong > 0);
          if (!times_us.contains({collective, row.bytes})) times_us[{collective, row.bytes}] = row.out.timing.reported_us;
          if (rank == 0) report_row(settings, row, world.size(), device_name, csv);
        }
      }
    }
    if (rank == 0) print_identity(settings, type_name, world.size(), times_us);
  }
  if (wrong_measurements > 0)
    throw AgreedError(ExitCode::runtime_failure,
                      fmt::format("{} measurement(s) gave wrong results", wrong_measurements));
}

}  // namespace

int main(int argc, char** argv) {
  // Plain host buffers: MPI's own collectives, not the shared-memory window of collective memory
  // (no shared_memory in the communicator's settings).
  return run_mpi_program(argc, argv, "commbench", [&](MpiCommunicator& world) {
    CommbenchSettings settings;
    agree_or_throw(world, [&] { settings = parse_commbench_options(argc, argv); });
    if (settings.help) {
      if (world.rank() == 0) std::fputs(settings.help_text.c_str(), stdout);
    } else {
      // A communicator of its own, made as the trainer makes its groups': MPI on the rank's
      // communication engine (on device buffers, staging them through host memory), or NCCL.
      const bool host = settings.path == "mpi-host";
      Config config;
      config.device.kind = host ? Device::cpu : settings.device == "cuda" ? Device::cuda : Device::loopback;
      config.device.comm = settings.path == "nccl" ? CommBackend::nccl : CommBackend::mpi;
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
      measure(settings, *communicator, host ? nullptr : device.memory.get());
    }
    return ExitCode::success;
  });
}
