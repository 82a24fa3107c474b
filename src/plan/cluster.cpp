// Cluster descriptions: presets and files (see cluster.hpp).
#include "plan/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
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

double Cluster::optimizer_rate(DataType type) const {
  return type != DataType::float32 && optimizer_16_bit_parameters_per_s > 0 ? optimizer_16_bit_parameters_per_s
                                                                            : optimizer_parameters_per_s;
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

namespace {

// A rank's bytes copied down to host memory and back up for a staged operation, as shares of its
// size (nccl-tests': the larger of its buffers) on the operation's path: a reduce-scatter sends
// everything and keeps its block, an all-gather the reverse; a broadcast's root, and a send's
// sender, copy down what the others copy up after the exchange.
struct StagedCopies {
  double down = 1;
  double up = 1;
};

StagedCopies staged_copies(CommOp op, int ranks) {
  const double block = 1.0 / ranks;
  switch (op) {
    case CommOp::reduce_scatter:
    case CommOp::scatter: return {.down = 1, .up = block};
    case CommOp::all_gather:
    case CommOp::gather: return {.down = block, .up = 1};
    default: return {};
  }
}

}  // namespace

LinkRates Cluster::staged_link(LinkClass link, CommOp op, int ranks) const {
  const LinkRates& direct = this->link(link, op);
  if (host_copy_bytes_per_s <= 0) return direct;
  const double network = link == LinkClass::intra_node ? host_intra_node.bus_bytes_per_s : direct.bus_bytes_per_s;
  // Seconds per byte of the operation's size, stage by stage.
  const StagedCopies copies = staged_copies(op, ranks);
  const double exchange = bus_factor(op, ranks) / network;
  const double down = copies.down / host_copy_bytes_per_s, up = copies.up / host_copy_bytes_per_s;
  const double seconds_per_byte = std::max({down, up, exchange});
  return {.latency_s = (link == LinkClass::intra_node ? 0.0 : direct.latency_s) + host_intra_node.latency_s,
          .bus_bytes_per_s = bus_factor(op, ranks) / seconds_per_byte};
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

}  // namespace mlptrain
