// commbench's command line (see commbench_options.hpp).
#include "bench/commbench_options.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <optional>
#include <sstream>

#include "core/config.hpp"
#include "core/error.hpp"

namespace mlptrain {

std::string_view time_report_name(TimeReport report) {
  switch (report) {
    case TimeReport::rank0: return "rank0";
    case TimeReport::average: return "avg";
    case TimeReport::minimum: return "min";
    case TimeReport::maximum: return "max";
  }
  return "max";
}

std::string_view issue_name(Issue issue) { return issue == Issue::blocking ? "blocking" : "started"; }

const std::vector<std::string> all_collectives = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                                  "broadcast",  "reduce",         "gather",     "scatter",
                                                  "send_recv"};

namespace {

const std::vector<std::string> device_copies = {"copy_to_host", "copy_to_device"};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) items.push_back(item);
  return items;
}

std::optional<TimeReport> parse_report(const std::string& text) {
  for (TimeReport report : {TimeReport::rank0, TimeReport::average, TimeReport::minimum, TimeReport::maximum})
    if (text == time_report_name(report)) return report;
  return std::nullopt;
}

// "256M", "64K", "8" -> bytes.
std::int64_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("'{}' is not a size in bytes (e.g. 8, 64K, 256M)", text));
  }
  const std::string suffix = text.substr(used);
  const std::int64_t scale = suffix.empty() ? 1 : suffix == "K" ? 1 << 10 : suffix == "M" ? 1 << 20
                                              : suffix == "G" ? std::int64_t{1} << 30 : 0;
  if (scale == 0 || value < 0)
    throw UsageError(fmt::format("'{}' is not a size in bytes (e.g. 8, 64K, 256M)", text));
  return value * scale;
}

}  // namespace

bool is_device_copy(const std::string& name) {
  return std::find(device_copies.begin(), device_copies.end(), name) != device_copies.end();
}

CommbenchSettings parse_commbench_options(int argc, char** argv) {
  namespace po = boost::program_options;
  CommbenchSettings settings;
  std::string collectives = "all", min_bytes = "8", max_bytes = "256M", chunk_bytes = "4M", dtypes = "fp32",
              report = "max", issues = "blocking";
  po::options_description options("commbench options");
  options.add_options()
      ("help", "print this help")
      ("collectives", po::value(&collectives)->default_value(collectives),
       "comma-separated: all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, reduce, gather, scatter, "
       "send_recv, or all (all of those, with anything else listed); on mpi-host also mpi_all_reduce (MPI_Allreduce called directly, the baseline); on a "
       "device path also copy_to_host, copy_to_device (each rank's pinned copies)")
      ("path", po::value(&settings.path)->default_value(settings.path), "mpi-host | mpi-staged | nccl")
      ("dtype", po::value(&dtypes)->default_value(dtypes), "element types, comma-separated: fp32, bf16, fp16")
      ("device", po::value(&settings.device)->default_value(settings.device),
       "device of mpi-staged buffers: cuda | loopback (the CPU behind device-style memory); nccl needs cuda")
      ("chunk-bytes", po::value(&chunk_bytes)->default_value(chunk_bytes),
       "mpi-staged piece size (every operation flows through host memory in pieces of about this size); 0 stages "
       "each message in one piece")
      ("issue", po::value(&issues)->default_value(issues),
       "comma-separated: blocking (each operation run to completion), started (started as the strategies start "
       "theirs, then waited for)")
      ("overlap", po::bool_switch(&settings.overlap),
       "time each started operation again while the host computes for as long as the operation took alone, and "
       "report the fraction of it the computation hid")
      ("min-bytes", po::value(&min_bytes)->default_value(min_bytes), "smallest size (K, M, G suffixes)")
      ("max-bytes", po::value(&max_bytes)->default_value(max_bytes), "largest size")
      ("step-factor", po::value(&settings.step_factor)->default_value(settings.step_factor),
       "each size is the previous one times this")
      ("iterations", po::value(&settings.iterations)->default_value(settings.iterations), "timed iterations per size")
      ("warmup", po::value(&settings.warmup)->default_value(settings.warmup), "untimed iterations first")
      ("report", po::value(&report)->default_value(report),
       "which rank's time a row reports: rank0 | avg | min | max (the spread across ranks is printed beside it)")
      ("json", po::bool_switch(&settings.json), "one JSON object per measurement")
      ("csv", po::value(&settings.csv_path), "also write the rows to this CSV file (rank 0)");
  po::variables_map values;
  try {
    po::store(po::parse_command_line(argc, argv, options), values);
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(error.what());
  }
  settings.help = values.count("help") > 0;
  std::ostringstream help;
  help << "usage: mpiexec -n N commbench [options]\n" << options;
  settings.help_text = help.str();
  settings.min_bytes = parse_bytes(min_bytes);
  settings.max_bytes = parse_bytes(max_bytes);
  settings.chunk_bytes = chunk_bytes == "0" ? 0 : parse_bytes(chunk_bytes);
  settings.dtypes.clear();
  for (const std::string& name : split_list(dtypes)) {
    const auto element = parse_choice<DataType>(name);
    if (!element || !(*element == DataType::float32 || is_half(*element)))
      throw UsageError(fmt::format("unknown --dtype '{}' (fp32, bf16 or fp16)", name));
    settings.dtypes.push_back(*element);
  }
  if (settings.dtypes.empty()) throw UsageError("--dtype names no element type (fp32, bf16 or fp16)");
  settings.issues.clear();
  for (const std::string& name : split_list(issues)) {
    if (name != "blocking" && name != "started")
      throw UsageError(fmt::format("unknown --issue '{}' (blocking or started)", name));
    settings.issues.push_back(name == "blocking" ? Issue::blocking : Issue::started);
  }
  if (settings.issues.empty()) throw UsageError("--issue names no way to issue (blocking or started)");
  if (settings.overlap && std::find(settings.issues.begin(), settings.issues.end(), Issue::started) == settings.issues.end())
    throw UsageError("--overlap times started operations: it needs --issue started (or blocking,started)");
  const auto report_mode = parse_report(report);
  if (!report_mode) throw UsageError(fmt::format("unknown --report '{}' (rank0, avg, min or max)", report));
  settings.report = *report_mode;
  if (settings.min_bytes < 1 || settings.min_bytes > settings.max_bytes)
    throw UsageError(fmt::format("--min-bytes {} must be at least 1 and at most --max-bytes {}", min_bytes, max_bytes));
  if (settings.step_factor < 2) throw UsageError("--step-factor must be at least 2");
  if (settings.iterations < 1 || settings.warmup < 0)
    throw UsageError("--iterations must be at least 1 and --warmup at least 0");
  if (settings.path != "mpi-host" && settings.path != "mpi-staged" && settings.path != "nccl")
    throw UsageError(fmt::format("unknown --path '{}' (mpi-host, mpi-staged or nccl)", settings.path));
  for (const std::string& name : split_list(collectives)) {
    if (name == "all") {  // every communicator collective, beside whatever else the list names
      settings.collectives.insert(settings.collectives.end(), all_collectives.begin(), all_collectives.end());
      continue;
    }
    if (std::find(all_collectives.begin(), all_collectives.end(), name) == all_collectives.end() &&
        !is_device_copy(name) && name != "mpi_all_reduce")
      throw UsageError(fmt::format("unknown collective '{}' in --collectives", name));
    if (name == "mpi_all_reduce" && settings.path != "mpi-host")
      throw UsageError("mpi_all_reduce times MPI_Allreduce on host buffers: it needs --path mpi-host");
    if (name == "mpi_all_reduce" && (settings.dtypes.size() != 1 || settings.dtypes[0] != DataType::float32))
      throw UsageError("mpi_all_reduce times MPI_Allreduce on fp32 elements (MPI has no 16-bit float sum): "
                       "use --dtype fp32");
    if (is_device_copy(name) && settings.path == "mpi-host")
      throw UsageError(fmt::format("{} times a device's copies: it needs --path mpi-staged or nccl", name));
    settings.collectives.push_back(name);
  }
  if (settings.collectives.empty()) throw UsageError("--collectives names no collective");
  if (settings.device != "cuda" && settings.device != "loopback")
    throw UsageError(fmt::format("unknown --device '{}' (cuda or loopback)", settings.device));
  if (settings.path == "nccl" && settings.device != "cuda")
    throw UsageError("--path nccl moves GPU buffers: it needs --device cuda");
  return settings;
}

}  // namespace mlptrain
