// This machine as a cluster, from layerbench and commbench output (see calibration.hpp).
#include "plan/calibration.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.hpp"

namespace mlptrain {

namespace {

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw UsageError(fmt::format("--calibrate {}: cannot be read", path));
  std::vector<nlohmann::json> rows;
  std::string line;
  int number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object())
      throw UsageError(fmt::format("--calibrate {}: line {} is not a JSON object", path, number));
    rows.push_back(std::move(row));
  }
  return rows;
}

// layerbench's kernel description ends "...; N GEMM thread(s)".
double gemm_threads(const std::string& kernels) {
  const std::size_t at = kernels.rfind(" GEMM thread");
  const std::size_t start = kernels.rfind(' ', at == std::string::npos || at == 0 ? 0 : at - 1);
  if (at == std::string::npos || start == std::string::npos) return 1;
  return std::max(1.0, std::atof(kernels.substr(start + 1, at - start - 1).c_str()));
}

// commbench's collective names; its send_recv row times a pipeline transfer.
std::optional<CommOp> calibrated_op(const std::string& collective) {
  if (collective == "send_recv") return CommOp::send;
  for (CommOp op : training_comm_ops)
    if (comm_op_name(op) == collective) return op;
  return std::nullopt;
}

// Merges another process's line of the same bench into `slowest`: the longer of each time, the
// smaller of each rate.
void slowest_of(nlohmann::json& slowest, const nlohmann::json& other) {
  for (const auto& [name, value] : other.items()) {
    if (!value.is_number() || !slowest.contains(name)) continue;
    const bool time = name.size() > 3 && name.ends_with("_ms"), rate = name.ends_with("gflops");
    if (time) slowest[name] = std::max(slowest[name].get<double>(), value.get<double>());
    if (rate) slowest[name] = std::min(slowest[name].get<double>(), value.get<double>());
  }
}

}  // namespace

Cluster calibrated_cluster(const std::vector<std::string>& files, const DeviceConfig& device, int world) {
  Cluster cluster{.name = "calibrated", .source = fmt::format("this machine: {}", fmt::join(files, ", "))};
  const bool gpu = device.kind == Device::cuda;
  const std::string bench_device = gpu ? "cuda" : "cpu";
  const std::string comm_path = !gpu ? "mpi-host" : device.comm == CommBackend::nccl ? "nccl" : "mpi-staged";
  cluster.device_memory_bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  // The elementwise and row-gather kernels run on one thread, AdamW on the rank's GEMM threads:
  // the bench, run as the world runs, measures them as a rank has them while ranks are no more
  // than cores.
  cluster.cores_per_device = gpu ? 1 : static_cast<int>(cores);
  cluster.overlaps_communication = gpu;
  // Per collective: the smallest message's time stands for the latency, the best bus bandwidth
  // for the bandwidth (fp32 rows of one path, the host's where there are several).
  std::map<CommOp, LinkRates> measured;
  std::map<CommOp, double> smallest;
  bool gemm_seen = false;
  std::map<double, double> fp32_sequence_rates;  // by rows
  double optimizer_parameters_timed = 0, optimizer_16_bit_parameters_timed = 0;
  // The bench's lines by type and rows: where processes ran it side by side (as the planned
  // world's ranks run), each time is the slowest process's, which a synchronous step waits for.
  std::map<std::pair<std::string, double>, nlohmann::json> benches;
  // A calibration run's metrics (mlptrain --metrics, its summary line): the update as the loop
  // runs it, by whether the run's parameters were 16-bit. Host time, so a CPU's alone.
  std::map<bool, double> loop_update_rates;
  for (const std::string& path : files)
    for (const nlohmann::json& row : json_lines(path)) {
      if (row.value("summary", false)) {
        const double update_ms = row.value("update_ms", 0.0), updated = row.value("updated_parameters", 0.0);
        const std::string param = row.value("param_dtype", "fp32");
        if (!gpu && update_ms > 0 && updated > 0)
          loop_update_rates[param == "bf16" || param == "fp16"] = updated / (update_ms * 1e-3);
      } else if (row.contains("gemm_gflops") && row.contains("dtype")) {
        if (row.value("device", "cpu") != bench_device) continue;
        if (row.value("dtype", "") == "fp32" && row.value("tf32", false) != (gpu && device.tf32)) continue;
        const auto [found, first] = benches.try_emplace({row.value("dtype", ""), row.value("rows", 0.0)}, row);
        if (!first) slowest_of(found->second, row);
      } else if (row.contains("collective") && row.value("dtype", "") == "fp32" &&
                 row.value("path", "") == comm_path && row.value("correct", true) &&
                 row.value("issue", "blocking") == "blocking") {  // an operation's own time
        const std::optional<CommOp> op = calibrated_op(row.value("collective", ""));
        const auto bytes = row.value("bytes", 0.0);
        if (!op || bytes <= 0) continue;
        LinkRates& rates = measured.try_emplace(*op, LinkRates{.bus_bytes_per_s = 0}).first->second;
        if (!smallest.contains(*op) || bytes < smallest[*op]) {
          smallest[*op] = bytes;
          rates.latency_s = row.value("time_us", 0.0) * 1e-6;
        }
        rates.bus_bytes_per_s = std::max(rates.bus_bytes_per_s, row.value("busbw_gbps", 0.0) * 1e9);
      }
    }
  for (const auto& [bench, row] : benches) {
    // The machine's rate: the bench's, per GEMM thread it ran, times the cores (the trainer
    // gives each of a node's ranks its share of them).
    // With --sequence, the rate of a training step's GEMMs (each over operands of its own,
    // not the same ones again) is the one to plan with.
    const double sequence_ms = row.value("library_sequence_gemm_ms", 0.0);
    const double bench_rate =
        sequence_ms > 0
            ? 2 * row.value("rows", 0.0) * row.value("in", 0.0) * row.value("out", 0.0) / (sequence_ms * 1e-3)
            : row.value("gemm_gflops", 0.0) * 1e9;
    // A GPU's rate is its own; a CPU bench's, per GEMM thread, times the cores.
    const double rate = gpu ? bench_rate : bench_rate * cores / gemm_threads(row.value("kernels", ""));
    const std::string dtype = row.value("dtype", "");
    double& slot = dtype == "bf16" ? cluster.gemm_bf16_flops_per_s
                   : dtype == "fp16" ? cluster.gemm_fp16_flops_per_s
                                     : cluster.gemm_fp32_flops_per_s;
    slot = std::max(slot, rate);
    if (dtype == "fp32" && sequence_ms > 0) fp32_sequence_rates[row.value("rows", 0.0)] = rate;
    // AdamW over the parameters the bench updated (older benches: the layer's), from the
    // row that updated the most: a rank's update runs from memory, not from the caches.
    const double parameters = row.value("adamw_parameters", row.value("in", 0.0) * row.value("out", 0.0) +
                                                                row.value("out", 0.0));
    // A 16-bit row's update is a 16-bit model's (its copy written too), planned for those apart.
    const bool sixteen_bit = dtype == "bf16" || dtype == "fp16";
    double& timed = sixteen_bit ? optimizer_16_bit_parameters_timed : optimizer_parameters_timed;
    if (row.value("adamw_ms", 0.0) > 0 && parameters > timed) {
      (sixteen_bit ? cluster.optimizer_16_bit_parameters_per_s : cluster.optimizer_parameters_per_s) =
          parameters / (row.value("adamw_ms", 0.0) * 1e-3);
      timed = parameters;
    }
    // GELU's pass (files from before the bias moved into the GEMM name it with the bias).
    const double gelu_ms = row.value("gelu_forward_ms", row.value("bias_gelu_forward_ms", 0.0));
    if (dtype == "fp32" && gelu_ms > 0)
      cluster.elementwise_elements_per_s = row.value("rows", 0.0) * row.value("out", 0.0) / (gelu_ms * 1e-3);
    // Samples read as the trainer reads them, one core's rate (input values a second).
    const double values = row.value("rows", 0.0) * row.value("in", 0.0);
    for (auto [key, slot] : {std::pair{"teacher_read_ms", &cluster.teacher_values_per_s},
                             std::pair{"mixture_read_ms", &cluster.mixture_values_per_s},
                             std::pair{"held_file_read_ms", &cluster.held_file_values_per_s}})
      if (dtype == "fp32" && row.value(key, 0.0) > 0) *slot = values / (row.value(key, 0.0) * 1e-3);
    if (dtype == "fp32" && row.value("gather_rows_ms", 0.0) > 0)
      cluster.row_move_elements_per_s =
          row.value("rows", 0.0) * row.value("out", 0.0) / (row.value("gather_rows_ms", 0.0) * 1e-3);
    if (gpu) {
      cluster.devices_per_node = std::max(cluster.devices_per_node, row.value("devices", 1));
      cluster.device_memory_bytes = row.value("device_memory_bytes", cluster.device_memory_bytes);
      // Built-in samples are generated on the GPU, on the step's path (the mixture's generator
      // is the one timed); a file's batches are read ahead by the host.
      cluster.teacher_values_per_s = cluster.held_file_values_per_s = cluster.mixture_values_per_s = 0;
      for (const nlohmann::json& kernel : row.value("kernel_table", nlohmann::json::array()))
        if (kernel.value("kernel", "") == "generate_mixture_samples" && kernel.value("ms", 0.0) > 0)
          cluster.mixture_values_per_s =
              kernel.value("samples", 0.0) * row.value("in", 0.0) / (kernel.value("ms", 0.0) * 1e-3);
    }
    gemm_seen = true;
  }
  if (measured.contains(CommOp::send)) measured[CommOp::recv] = measured[CommOp::send];
  if (fp32_sequence_rates.size() > 1)
    for (const auto& [rows, rate] : fp32_sequence_rates)
      cluster.gemm_rows_shares.emplace_back(rows, rate / cluster.gemm_fp32_flops_per_s);
  // The loop's update, where a calibration run timed it, stands for AdamW alone: the same
  // kernel over a model's ranges ran 1.2-1.3 times the bench's time here.
  if (loop_update_rates.contains(false)) cluster.optimizer_parameters_per_s = loop_update_rates[false];
  if (loop_update_rates.contains(true)) cluster.optimizer_16_bit_parameters_per_s = loop_update_rates[true];
  if (!gemm_seen || cluster.optimizer_parameters_per_s <= 0)
    throw UsageError(fmt::format("--calibrate {}: no layerbench rows of --device {}{} (fp32 GEMM and AdamW times)",
                                 fmt::join(files, " "), bench_device, gpu && device.tf32 ? " --tf32" : ""));
  // One rank sends nothing: its plan needs no collective's rates.
  if (!measured.contains(CommOp::all_reduce) && world > 1)
    throw UsageError(fmt::format("--calibrate {}: no commbench fp32 all_reduce rows on {}", fmt::join(files, " "),
                                 comm_path));
  if (!measured.contains(CommOp::all_reduce)) measured[CommOp::all_reduce] = LinkRates{.bus_bytes_per_s = 1};
  // Types the bench did not time run at the fp32 rate; rows it did not time move at the
  // elementwise rate; collectives it did not time at the all-reduce's; one node, so both link
  // classes are the machine's.
  for (double* rate : {&cluster.gemm_bf16_flops_per_s, &cluster.gemm_fp16_flops_per_s})
    if (*rate <= 0) *rate = cluster.gemm_fp32_flops_per_s;
  if (cluster.row_move_elements_per_s <= 0) cluster.row_move_elements_per_s = cluster.elementwise_elements_per_s;
  for (LinkClass link : all_link_classes)
    for (CommOp op : all_comm_ops)
      cluster.links[static_cast<std::size_t>(link)][static_cast<std::size_t>(op)] =
          measured.contains(op) ? measured[op] : measured[CommOp::all_reduce];
  return cluster;
}

}  // namespace mlptrain
