// mlpplan's JSON rows and tables (see plan_report.hpp).
#include "plan/plan_report.hpp"

#include <fmt/format.h>

#include "strategies/pipeline_parallel/pipeline_options.hpp"
#include "strategies/tensor_parallel/tensor_options.hpp"
#include "strategies/zero/zero_options.hpp"

namespace mlptrain {

namespace {

std::string layout_name(const Config& config) {
  const ZeroOptions& zero = config.strategies.get<ZeroOptions>();
  const PipelineOptions& pipeline = config.strategies.get<PipelineOptions>();
  const bool sequence_parallel = config.strategies.get<TensorParallelOptions>().sequence_parallel;
  std::string name = fmt::format("dp{} tp{}{} pp{}", config.grid.dp, config.grid.tp, sequence_parallel ? "sp" : "", config.grid.pp);
  if (config.grid.ep > 1) name += fmt::format(" ep{}", config.grid.ep);
  if (config.grid.pp > 1) name += fmt::format(" {}", pipeline.schedule.get().name);
  if (pipeline.virtual_stages > 1) name += fmt::format("/{}", pipeline.virtual_stages);
  name += fmt::format(" zero{}", zero.stage);
  if (zero.shard_size > 0) name += fmt::format("/{}", zero.shard_size);
  name += fmt::format(" mb{}", config.data.micro_batches);
  if (config.training.recompute) name += " recompute";
  if (config.device.offload) name += " offload";
  return name;
}

double gigabytes(double bytes) { return bytes / 1e9; }
double gibibytes(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }
double milliseconds(double seconds) { return seconds * 1e3; }

}  // namespace

nlohmann::json plan_json(const PlannedLayout& planned, int world, int ranks_per_node) {
  const Config& config = planned.config;
  const LayoutEstimate& estimate = planned.estimate;
  nlohmann::json memory = nlohmann::json::object(), modes = nlohmann::json::object();
  for (MemoryState state : placed_states) {
    memory[std::string(memory_state_name(state))] = estimate.prediction.state(state).bytes;
    modes[std::string(memory_state_name(state))] = mode_code(estimate.prediction.state(state).mode);
  }
  memory["total"] = estimate.memory_total;
  nlohmann::json comm = nlohmann::json::object();
  for (CommOp op : training_comm_ops) comm[std::string(comm_op_name(op))] = estimate.prediction.comm(op);
  const StepTime& step = estimate.step;
  const ZeroOptions& zero = config.strategies.get<ZeroOptions>();
  const PipelineOptions& pipeline = config.strategies.get<PipelineOptions>();
  const nlohmann::json layout = {{"dp", config.grid.dp},
                                 {"tp", config.grid.tp},
                                 {"pp", config.grid.pp},
                                 {"ep", config.grid.ep},
                                 {"zero", zero.stage},
                                 {"zero_shard_size", zero.shard_size},
                                 {"sequence_parallel", config.strategies.get<TensorParallelOptions>().sequence_parallel},
                                 {"schedule", config.grid.pp > 1 ? pipeline.schedule.get().name : "none"},
                                 {"virtual_stages", pipeline.virtual_stages},
                                 {"micro_batches", config.data.micro_batches},
                                 {"recompute", config.training.recompute},
                                 {"offload", config.device.offload}};
  return {{"layout", layout},
          {"world", world},
          {"ranks_per_node", ranks_per_node},
          {"fits", estimate.fits()},
          {"memory_capacity_bytes", static_cast<std::int64_t>(estimate.memory_capacity)},
          {"memory_bytes", memory},
          {"memory_rank", estimate.memory_rank},
          {"modes", modes},
          {"comm_bytes_per_step", comm},
          {"bus_bytes_per_step", {{"intra_node", estimate.bus_bytes.intra_node}, {"inter_node", estimate.bus_bytes.inter_node}}},
          {"step_ms",
           {{"compute", milliseconds(step.compute)},
            {"compute_parts",
             {{"forward", milliseconds(step.forward)},
              {"backward", milliseconds(step.backward)},
              {"optimizer", milliseconds(step.optimizer)}}},
            {"exposed_comm", milliseconds(step.exposed_comm)},
            {"bubble", milliseconds(step.bubble)},
            {"data", milliseconds(step.data)},
            {"total", milliseconds(step.total())}}},
          {"samples_per_s", step.total() > 0 ? config.data.global_batch / step.total() : 0.0},
          {"param_dtype", data_type_name(config.precision.types().param)},
          {"reduce_dtype", data_type_name(config.precision.types().reduce)}};
}

std::string cluster_line(const Cluster& cluster, int world, int ranks_per_node, const Precision& precision,
                         const DeviceConfig& device) {
  const int nodes = (world + ranks_per_node - 1) / ranks_per_node;
  std::string line = fmt::format("cluster {}: {} node(s) of {} rank(s), {} device(s) of {:.1f} GB per node ({})\n",
                                 cluster.name, nodes, ranks_per_node, cluster.devices_per_node,
                                 gigabytes(cluster.device_memory_bytes), cluster.source);
  // More ranks than devices on a node share them: each rank then has its share of their memory
  // (and of their compute), which is what "a rank has" below means.
  if (ranks_per_node > cluster.devices_per_node)
    line += fmt::format("  {} ranks share a node's {} devices: each has {:.3f} GB of memory and {:.3f} of a device\n",
                        ranks_per_node, cluster.devices_per_node,
                        gigabytes(cluster.device_memory_bytes) * cluster.devices_per_node / ranks_per_node,
                        static_cast<double>(cluster.devices_per_node) / ranks_per_node);
  // --fp8: the rate its dense layers' GEMMs are planned at.
  if (precision.fp8_gemms())
    line += cluster.gemm_fp8_flops_per_s > 0
                ? fmt::format("  fp8: dense layers' GEMMs at {:.1f} TFLOP/s a device\n", cluster.gemm_fp8_flops_per_s / 1e12)
                : fmt::format("  fp8: no fp8 rate for this cluster (no fp8 tensor cores, or the CPU's emulation): dense "
                              "layers' GEMMs at {}'s {:.1f} TFLOP/s\n",
                              data_type_name(precision.param), cluster.gemm_flops_per_s(precision.param) / 1e12);
  // GPUs: the path their collectives take.
  if (device.kind == Device::cuda)
    line += host_staged(device) && cluster.host_copy_bytes_per_s > 0
                ? fmt::format("  communication: MPI staged through host memory (copies {:.1f} GB/s a direction, host "
                              "MPI {:.2f} GB/s within a node)\n",
                              cluster.host_copy_bytes_per_s / 1e9, cluster.host_intra_node.bus_bytes_per_s / 1e9)
                : fmt::format("  communication: {} over the cluster's links\n",
                              host_staged(device) ? "MPI staged through host memory, as measured," : "NCCL");
  return line;
}

std::string layout_table(const PlannedLayout& planned, int world) {
  const LayoutEstimate& estimate = planned.estimate;
  std::string text = fmt::format("mlpplan: {} rank(s): {}; rank {} needs the most\n", world,
                                 layout_name(planned.config), estimate.memory_rank);
  text += fmt::format("  {:<14}{:<6}{:>18}{:>12}{:>12}\n", "state", "mode", "bytes", "GB (1e9)", "GiB");
  const auto row = [&](std::string_view name, std::string_view mode, double bytes) {
    text += fmt::format("  {:<14}{:<6}{:>18.0f}{:>12.3f}{:>12.3f}\n", name, mode, bytes, gigabytes(bytes), gibibytes(bytes));
  };
  for (MemoryState state : placed_states)
    row(memory_state_name(state), mode_code(estimate.prediction.state(state).mode),
        static_cast<double>(estimate.prediction.state(state).bytes));
  row("total", "", static_cast<double>(estimate.memory_total));
  text += fmt::format("  {} the {:.3f} GB a rank has\n", estimate.fits() ? "fits in" : "does NOT fit in",
                      gigabytes(estimate.memory_capacity));
  text += "  communication per step (nccl-tests' sizes):\n";
  for (CommOp op : training_comm_ops)
    if (estimate.prediction.comm(op) > 0)
      text += fmt::format("  {:<16}{:>18} bytes\n", comm_op_name(op), estimate.prediction.comm(op));
  text += fmt::format("  bus bytes per step: {} within a node, {} across nodes\n", estimate.bus_bytes.intra_node,
                      estimate.bus_bytes.inter_node);
  const StepTime& step = estimate.step;
  text += fmt::format("  step time {:.3f} ms: compute {:.3f}, exposed communication {:.3f}, bubble {:.3f}, "
                      "data {:.3f}; {:.1f} samples/s\n",
                      milliseconds(step.total()), milliseconds(step.compute), milliseconds(step.exposed_comm),
                      milliseconds(step.bubble), milliseconds(step.data), planned.config.data.global_batch / step.total());
  return text;
}

std::string ranking_table(const std::vector<PlannedLayout>& ranked, int top) {
  std::string text = fmt::format("  {:<6}{:<44}{:>12}{:>12}{:>12}{:>12}{:>12}{:>14}\n", "#", "layout", "memory GB",
                                 "step ms", "compute", "exp. comm", "bubble", "inter-node GB");
  int shown_fit = 0, shown_over = 0, position = 0;
  for (const PlannedLayout& planned : ranked) {
    ++position;
    const LayoutEstimate& estimate = planned.estimate;
    int& shown = estimate.fits() ? shown_fit : shown_over;
    if (top > 0 && shown >= top) continue;
    if (!estimate.fits() && shown_over == 0) text += "  does not fit (by how much):\n";
    ++shown;
    const StepTime& step = estimate.step;
    text += fmt::format("  {:<6}{:<44}{:>12.3f}{:>12.3f}{:>12.3f}{:>12.3f}{:>12.3f}{:>14.3f}", position,
                        layout_name(planned.config), gigabytes(static_cast<double>(estimate.memory_total)),
                        milliseconds(step.total()), milliseconds(step.compute), milliseconds(step.exposed_comm),
                        milliseconds(step.bubble), gigabytes(static_cast<double>(estimate.bus_bytes.inter_node)));
    if (!estimate.fits())
      text += fmt::format("  over by {:.3f} GB",
                          gigabytes(static_cast<double>(estimate.memory_total) - estimate.memory_capacity));
    text += "\n";
  }
  return text;
}

}  // namespace mlptrain
