// What the planner knows of a cluster: per node, its devices and their memory and rates (GEMM
// per dtype, memory-bound work), and per link class (within a node, across nodes) the latency
// and bus bandwidth of each collective. A cluster comes from a preset (public specifications,
// sources in the README), from a JSON file in the same terms, or from this machine's own
// layerbench and commbench --json output (--calibrate).
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm_op.hpp"
#include "core/data_type.hpp"

namespace mlptrain {

enum class LinkClass { intra_node, inter_node };
inline constexpr std::array<LinkClass, 2> all_link_classes = {LinkClass::intra_node, LinkClass::inter_node};
std::string_view link_class_name(LinkClass link);

// One collective on one link class: time = latency + bus bytes / bus bandwidth (nccl-tests'
// bus bytes: the operation's size times its bus factor).
struct LinkRates {
  double latency_s = 0;
  double bus_bytes_per_s = 1;
};

struct Cluster {
  std::string name;
  std::string source;         // where the figures come from
  int devices_per_node = 1;   // ranks beyond this many on a node share the devices
  double device_memory_bytes = 0;
  // Dense GEMM rates of one device, FLOP/s, by the GEMM's input type (fp32 GEMMs as the trainer
  // runs them: TF32 where --tf32 would be given is not modelled).
  double gemm_fp32_flops_per_s = 0;
  double gemm_bf16_flops_per_s = 0;
  double gemm_fp16_flops_per_s = 0;
  // Memory-bound work of one device: the optimizer's update, the bias/GELU passes, and rows
  // gathered or scattered by an index (MoE layers' dispatch and combine).
  double optimizer_parameters_per_s = 0;
  double elementwise_elements_per_s = 0;
  double row_move_elements_per_s = 0;
  // Cores of one device whose memory-bound kernels run on one of them (a calibrated machine:
  // its cores; a GPU: 1). A rank that has a core to itself runs them at the measured rate.
  int cores_per_device = 1;
  std::array<std::array<LinkRates, comm_op_count>, all_link_classes.size()> links{};

  double gemm_flops_per_s(DataType type) const;
  // The part of the memory-bound rates a rank gets when it holds `share` of a device.
  double memory_bound_share(double share) const { return std::min(1.0, share * cores_per_device); }
  const LinkRates& link(LinkClass link, CommOp op) const {
    return links[static_cast<std::size_t>(link)][static_cast<std::size_t>(op)];
  }
};

// Names of the built-in presets, for messages and help.
std::vector<std::string_view> cluster_preset_names();
// A preset by name, else a JSON file at that path (see the README for its keys). Throws
// UsageError naming the preset or the file and what is wrong with it.
Cluster load_cluster(const std::string& preset_or_file);
// This machine, one node whose cores its ranks share, from layerbench output (GEMM rates per
// dtype, scaled from the bench's GEMM threads to the machine's cores; with --sequence, the rate
// of a step's GEMMs over operands of their own; optimizer, elementwise and row-gather rates,
// the last at the elementwise rate where the bench gives none) and commbench
// --json output (latency and bus bandwidth per collective); every file may hold either, one JSON
// object per line. Device memory: the machine's physical memory.
Cluster calibrated_cluster(const std::vector<std::string>& files);

}  // namespace mlptrain
