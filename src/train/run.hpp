// A training run on this rank, built from the configuration in dependency order: the compute
// device (its staging carries the groups' messages), the process groups, the dataset, the model on
// this rank (train/rank_model.hpp), the order samples are read in and the feed that reads them,
// the step's schedule and its executor, and the reporter. A problem that some ranks meet and
// others do not (a file one cannot read, memory one cannot get) is agreed on over the world, so
// every rank stops with the same line. The loop, the checkpointer and the report work on it.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/config.hpp"
#include "core/trace.hpp"
#include "data/dataset.hpp"
#include "data/sample_order.hpp"
#include "device/compute_device.hpp"
#include "train/rank_model.hpp"
#include "train/report.hpp"
#include "train/sample_feed.hpp"
#include "train/schedule_executor.hpp"

namespace mlptrain {

struct Run {
  Run(const Config& run_config, MPI_Comm world, const CommSettings& comm);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  Communicator& world() const { return groups->world(); }
  bool rank_zero() const { return world().rank() == 0; }
  // Whether this rank's loss sums count in the world's totals: the loss is computed where the
  // last layer is, and the ranks of a tensor-parallel group all hold the same one.
  bool counts_loss() const { return model->computes_loss() && groups->place().tp == 0; }
  // This rank's samples of a training micro-batch.
  std::vector<std::int64_t> train_samples(std::int64_t step, int micro_batch) const {
    return order->samples(batch.first_position(step, micro_batch, groups->place().dp), batch.local_size());
  }

  const Config& config;
  MPI_Comm mpi_world;
  MemoryLedger memory;
  MemoryLedger host_memory;  // what --offload keeps in host memory
  CommLedger comm_ledger;
  // Before everything that may still complete communication while being destroyed.
  std::unique_ptr<TraceRecorder> trace;
  double trace_origin_ms = 0;
  ComputeDevice device;
  std::unique_ptr<ProcessGroups> groups;
  std::unique_ptr<Dataset> dataset;
  LossKind loss_kind = LossKind::mse;
  std::vector<int> moe_layers;  // the model's MoE layers, in order
  Strategies strategies;        // those that take part
  std::unique_ptr<RankModel> model;
  std::unique_ptr<SampleOrder> order;
  std::unique_ptr<SampleFeed> feed;
  BatchLayout batch;
  std::vector<Action> schedule;  // a training step's actions
  std::unique_ptr<ScheduleExecutor> executor;
  std::unique_ptr<Reporter> reporter;
};

}  // namespace mlptrain
