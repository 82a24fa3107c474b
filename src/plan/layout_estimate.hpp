// One layout's answer from the planner: the memory by state of the rank that needs the most, its
// communication per step by operation and by link class, and the step time, from the trainer's
// own pure functions (strategies/rank_plan.hpp) and a cluster's rates. Pure arithmetic: nothing of
// the model is allocated, no MPI, and the work is flat in the world size (ranks that differ only
// in their data- or tensor-parallel coordinate hold and move the same amounts, so one rank per
// pipeline stage stands for the world).
#pragma once

#include <cstdint>
#include <vector>

#include "strategies/rank_plan.hpp"
#include "model/loss.hpp"
#include "plan/cluster.hpp"

namespace mlptrain {

struct PlanInputs {
  const Strategies& strategies;
  const Config& config;  // validated for shape.world
  const std::vector<LayerSpec>& model;
  GridShape shape;
  LossKind loss_kind = LossKind::mse;
  int ranks_per_node = 1;
  const Cluster& cluster;
  bool data_held_in_memory = false;  // an hdf5 file's arrays fit under --data-memory-mb
  // An MoE layer's rows on the busiest of the ranks that split its experts, over the mean: that
  // rank's experts set the layer's pace (the exchanges wait for it). 1: balanced routing.
  double expert_imbalance = 1.0;
  // The same at the routing's most uneven step: a rank's peak activations are that step's.
  double expert_peak_imbalance = 1.0;
};

// Bus bytes per step (nccl-tests' size times the bus factor) by the links they cross: a group's
// collective crosses nodes when its ranks do (its slowest link then sets its pace).
struct LinkBytes {
  std::int64_t intra_node = 0;
  std::int64_t inter_node = 0;
};

// A step's time, seconds, on the pipeline stage that takes longest: computation (GEMMs,
// bias/GELU passes and the optimizer), communication nothing hides, the pipeline's idle time,
// and the wait for samples where they are read on the step's path.
struct StepTime {
  double compute = 0;  // forward + backward + optimizer, below
  double forward = 0, backward = 0, optimizer = 0;
  double exposed_comm = 0;
  double bubble = 0;
  double data = 0;
  double total() const { return compute + exposed_comm + bubble + data; }
};

struct LayoutEstimate {
  int memory_rank = 0;
  Prediction prediction;           // of memory_rank
  std::int64_t memory_total = 0;   // bytes over the placed states of memory_rank
  double memory_capacity = 0;      // bytes one rank may use: its device's (or its share)
  LinkBytes bus_bytes;             // of memory_rank
  StepTime step;
  bool fits() const { return static_cast<double>(memory_total) <= memory_capacity; }
};

// Whether the group of `kind` that holds `rank` spans more than one node of `ranks_per_node`
// consecutive ranks (for pipeline transfers: whether a neighbouring stage is on another node).
bool crosses_nodes(const GridShape& shape, GroupKind kind, int rank, int ranks_per_node);

LayoutEstimate estimate_layout(const PlanInputs& inputs);

}  // namespace mlptrain
