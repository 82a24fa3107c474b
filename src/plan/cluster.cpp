// Cluster descriptions: presets, files and calibration (see cluster.hpp).
#include "plan/cluster.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.hpp"

namespace mlptrain {

std::string_view link_class_name(LinkClass link) {
  return link == LinkClass::intra_node ? "intra_node" : "inter_node";
}

double Cluster::gemm_flops_per_s(DataType type) const {
  if (type == DataType::bfloat16) return gemm_bf16_flops_per_s;
  if (type == DataType::float16) return gemm_fp16_flops_per_s;
  return gemm_fp32_flops_per_s;
}

double Cluster::linear_gemm_flops_per_s(const Precision& precision) const {
  return precision.fp8_gemms() && gemm_fp8_flops_per_s > 0 ? gemm_fp8_flops_per_s : gemm_flops_per_s(precision.param);
}

double Cluster::gemm_rows_share(double rows) const {
  if (gemm_rows_shares.empty()) return 1.0;
  if (rows <= gemm_rows_shares.front().first) return gemm_rows_shares.front().second;
  if (rows >= gemm_rows_shares.back().first) return gemm_rows_shares.back().second;
  const auto above = std::find_if(gemm_rows_shares.begin(), gemm_rows_shares.end(),
                                  [rows](const auto& point) { return point.first >= rows; });
  const auto below = std::prev(above);
  const double position = std::log(rows / below->first) / std::log(above->first / below->first);
  return below->second + position * (above->second - below->second);
}

LinkRates Cluster::staged_link(LinkClass link, CommOp op) const {
  const LinkRates& direct = this->link(link, op);
  if (host_copy_bytes_per_s <= 0) return direct;
  const double network = link == LinkClass::intra_node ? host_intra_node.bus_bytes_per_s : direct.bus_bytes_per_s;
  return {.latency_s = (link == LinkClass::intra_node ? 0.0 : direct.latency_s) + host_intra_node.latency_s,
          .bus_bytes_per_s = std::min(host_copy_bytes_per_s, network)};
}

double Cluster::sample_values_per_s(DatasetKind dataset, bool held_in_memory) const {
  switch (dataset) {
    case DatasetKind::teacher: return teacher_values_per_s;
    case DatasetKind::mixture: return mixture_values_per_s;
    case DatasetKind::hdf5: return held_in_memory ? held_file_values_per_s : 0.0;
  }
  return 0.0;
}

namespace {

// AdamW in fp32 reads a parameter, its gradient and two moments and writes three of them back:
// 28 bytes per parameter; a bias/GELU pass reads and writes one fp32 element: 8 bytes, and so
// does a row gathered or scattered (its index is one read per row).
constexpr double optimizer_bytes_per_parameter = 28;
constexpr double elementwise_bytes_per_element = 8;
constexpr double row_move_bytes_per_element = 8;

void set_every_op(Cluster& cluster, LinkClass link, LinkRates rates) {
  cluster.links[static_cast<std::size_t>(link)].fill(rates);
}

// The keys of a cluster file; the presets are written in the same terms.
Cluster from_json(const nlohmann::json& object, const std::string& where) {
  const auto number = [&](const nlohmann::json& parent, const std::string& key, const std::string& path) {
    if (!parent.is_object() || !parent.contains(key) || !parent[key].is_number() || parent[key].get<double>() <= 0)
      throw UsageError(fmt::format("{}: '{}' must be a positive number", where, path));
    return parent[key].get<double>();
  };
  Cluster cluster;
  cluster.name = object.value("name", where);
  cluster.source = object.value("source", "");
  cluster.devices_per_node = static_cast<int>(number(object, "devices_per_node", "devices_per_node"));
  cluster.device_memory_bytes = number(object, "device_memory_gb", "device_memory_gb") * 1e9;
  const nlohmann::json gemm = object.value("gemm_tflops", nlohmann::json{});
  cluster.gemm_fp32_flops_per_s = number(gemm, "fp32", "gemm_tflops.fp32") * 1e12;
  cluster.gemm_bf16_flops_per_s = number(gemm, "bf16", "gemm_tflops.bf16") * 1e12;
  cluster.gemm_fp16_flops_per_s = number(gemm, "fp16", "gemm_tflops.fp16") * 1e12;
  if (gemm.is_object() && gemm.contains("fp8")) cluster.gemm_fp8_flops_per_s = number(gemm, "fp8", "gemm_tflops.fp8") * 1e12;
  const double memory_bytes_per_s = number(object, "memory_gb_per_s", "memory_gb_per_s") * 1e9;
  cluster.optimizer_parameters_per_s = memory_bytes_per_s / optimizer_bytes_per_parameter;
  cluster.elementwise_elements_per_s = memory_bytes_per_s / elementwise_bytes_per_element;
  cluster.row_move_elements_per_s = memory_bytes_per_s / row_move_bytes_per_element;
  const auto link_rates = [&](const nlohmann::json& rates, const std::string& key) {
    return LinkRates{.latency_s = number(rates, "latency_us", key + ".latency_us") * 1e-6,
                     .bus_bytes_per_s = number(rates, "bus_gb_per_s", key + ".bus_gb_per_s") * 1e9};
  };
  for (LinkClass link : all_link_classes) {
    const std::string key(link_class_name(link));
    set_every_op(cluster, link, link_rates(object.value(key, nlohmann::json{}), key));
  }
  if (object.contains("host_staging")) {
    const nlohmann::json& staging = object["host_staging"];
    cluster.host_copy_bytes_per_s = number(staging, "copy_gb_per_s", "host_staging.copy_gb_per_s") * 1e9;
    cluster.host_intra_node =
        link_rates(staging.value("intra_node", nlohmann::json{}), "host_staging.intra_node");
  }
  return cluster;
}

// Public specifications: dense (not sparse) tensor-core rates, memory bandwidth and capacity
// from NVIDIA's H100 (SXM5) and A100 (80 GB SXM) datasheets (the A100 has no fp8 tensor cores);
// NVLink per GPU per direction (900 and 600 GB/s bidirectional); one 400 Gb/s NDR (DGX H100) or
// 200 Gb/s HDR (DGX A100) InfiniBand adapter per GPU. Latencies are typical small-message
// figures, not specifications. Host staging: a GPU's PCIe link to the host per direction (Gen5
// x16 64 GB/s, Gen4 x16 32 GB/s, the PCI-SIG rates) and MPI's host all-reduce within a node at
// the chunk size staging sends, as measured on an H200 machine's host (16 cores of an Intel Xeon,
// MPICH on shared memory, 2 ranks, 4 MiB messages: 4.75 GB/s): a measurement, not a
// specification, for want of one.
const std::map<std::string, nlohmann::json>& presets() {
  static const std::map<std::string, nlohmann::json> table = {
      {"h100-sxm-8",
       {{"name", "h100-sxm-8"},
        {"source", "NVIDIA H100 datasheet (SXM5), DGX H100: NVLink 4 900 GB/s, 8 x 400 Gb/s NDR InfiniBand"},
        {"devices_per_node", 8},
        {"device_memory_gb", 80},
        {"gemm_tflops", {{"fp32", 67}, {"bf16", 989.4}, {"fp16", 989.4}, {"fp8", 1978.9}}},
        {"memory_gb_per_s", 3350},
        {"intra_node", {{"latency_us", 3}, {"bus_gb_per_s", 450}}},
        {"inter_node", {{"latency_us", 6}, {"bus_gb_per_s", 50}}},
        {"host_staging", {{"copy_gb_per_s", 64}, {"intra_node", {{"latency_us", 5}, {"bus_gb_per_s", 4.75}}}}}}},
      {"a100-80gb-8",
       {{"name", "a100-80gb-8"},
        {"source", "NVIDIA A100 datasheet (80 GB SXM), DGX A100: NVLink 3 600 GB/s, 8 x 200 Gb/s HDR InfiniBand"},
        {"devices_per_node", 8},
        {"device_memory_gb", 80},
        {"gemm_tflops", {{"fp32", 19.5}, {"bf16", 312}, {"fp16", 312}}},
        {"memory_gb_per_s", 2039},
        {"intra_node", {{"latency_us", 3}, {"bus_gb_per_s", 300}}},
        {"inter_node", {{"latency_us", 6}, {"bus_gb_per_s", 25}}},
        {"host_staging", {{"copy_gb_per_s", 32}, {"intra_node", {{"latency_us", 5}, {"bus_gb_per_s", 4.75}}}}}}},
  };
  return table;
}

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

// commbench's collective names; its send_recv row times a pipeline transfer.
// layerbench's kernel description ends "...; N GEMM thread(s)".
double gemm_threads(const std::string& kernels) {
  const std::size_t at = kernels.rfind(" GEMM thread");
  const std::size_t start = kernels.rfind(' ', at == std::string::npos || at == 0 ? 0 : at - 1);
  if (at == std::string::npos || start == std::string::npos) return 1;
  return std::max(1.0, std::atof(kernels.substr(start + 1, at - start - 1).c_str()));
}

std::optional<CommOp> calibrated_op(const std::string& collective) {
  if (collective == "send_recv") return CommOp::send;
  for (CommOp op : training_comm_ops)
    if (comm_op_name(op) == collective) return op;
  return std::nullopt;
}

}  // namespace

std::vector<std::string_view> cluster_preset_names() {
  std::vector<std::string_view> names;
  for (const auto& [name, description] : presets()) names.push_back(name);
  return names;
}

Cluster load_cluster(const std::string& preset_or_file) {
  if (const auto found = presets().find(preset_or_file); found != presets().end())
    return from_json(found->second, preset_or_file);
  std::ifstream file(preset_or_file);
  if (!file)
    throw UsageError(fmt::format("--cluster {}: neither a preset ({}) nor a readable file", preset_or_file,
                                 fmt::join(cluster_preset_names(), ", ")));
  const nlohmann::json object = nlohmann::json::parse(file, nullptr, false);
  if (!object.is_object()) throw UsageError(fmt::format("--cluster {}: not a JSON object", preset_or_file));
  return from_json(object, "--cluster " + preset_or_file);
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

Cluster calibrated_cluster(const std::vector<std::string>& files, const DeviceConfig& device) {
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
  double optimizer_parameters_timed = 0;
  // The bench's lines by type and rows: where processes ran it side by side (as the planned
  // world's ranks run), each time is the slowest process's, which a synchronous step waits for.
  std::map<std::pair<std::string, double>, nlohmann::json> benches;
  for (const std::string& path : files)
    for (const nlohmann::json& row : json_lines(path)) {
      if (row.contains("gemm_gflops") && row.contains("dtype")) {
        if (row.value("device", "cpu") != bench_device) continue;
        if (row.value("dtype", "") == "fp32" && row.value("tf32", false) != (gpu && device.tf32)) continue;
        const auto [found, first] = benches.try_emplace({row.value("dtype", ""), row.value("rows", 0.0)}, row);
        if (!first) slowest_of(found->second, row);
      } else if (row.contains("collective") && row.value("dtype", "") == "fp32" &&
                 row.value("path", "") == comm_path && row.value("correct", true)) {
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
    if (dtype == "fp32" && row.value("adamw_ms", 0.0) > 0 && parameters > optimizer_parameters_timed) {
      cluster.optimizer_parameters_per_s = parameters / (row.value("adamw_ms", 0.0) * 1e-3);
      optimizer_parameters_timed = parameters;
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
  if (!gemm_seen || cluster.optimizer_parameters_per_s <= 0)
    throw UsageError(fmt::format("--calibrate {}: no layerbench rows of --device {}{} (fp32 GEMM and AdamW times)",
                                 fmt::join(files, " "), bench_device, gpu && device.tf32 ? " --tf32" : ""));
  if (!measured.contains(CommOp::all_reduce))
    throw UsageError(fmt::format("--calibrate {}: no commbench fp32 all_reduce rows on {}", fmt::join(files, " "),
                                 comm_path));
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
