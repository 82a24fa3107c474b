// A training run on this rank, built from the configuration in dependency order: the ledgers, the
// compute device (its staging carries the groups' messages), the process groups, the model on
// this rank (train/rank_model.hpp), its data (feed/run_samples.hpp), the step's schedule and its
// executor, and the reporter. A problem that some ranks meet and
// others do not (a file one cannot read, memory one cannot get) is agreed on over the world, so
// every rank stops with the same line. The loop, the checkpointer and the report work on it.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/config.hpp"
#include "core/trace.hpp"
#include "device/compute_device.hpp"
#include "train/rank_model.hpp"
#include "report/reporter.hpp"
#include "feed/run_samples.hpp"
#include "train/schedule_executor.hpp"

namespace mlptrain {

// What a run measures: memory by state (the device's, and what --offload keeps in host memory),
// communication, and with --trace the timeline of every span.
struct RunLedgers {
  MemoryLedger memory;
  MemoryLedger host_memory;
  CommLedger comm;
  std::unique_ptr<TraceRecorder> trace;
  double trace_origin_ms = 0;  // the ranks' common time origin

  // A step's figures start afresh.
  void begin_step(std::int64_t step) {
    comm.begin_step();
    memory.reset_peaks();
    if (trace) trace->set_step(step);
  }
};

struct Run {
  Run(const Config& run_config, MPI_Comm world, const CommSettings& comm);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  Communicator& world() const { return groups->world(); }
  bool rank_zero() const { return world().rank() == 0; }
  // Whether this rank's loss sums count in the world's totals: the loss is computed where the
  // last layer is, and the ranks of a tensor-parallel group all hold the same one.
  bool counts_loss() const { return model->computes_loss() && groups->place().tp == 0; }

  const Config& config;
  MPI_Comm mpi_world;
  // Before everything that may still complete communication while being destroyed.
  RunLedgers ledgers;
  ComputeDevice device;
  std::unique_ptr<ProcessGroups> groups;
  std::unique_ptr<RankModel> model;
  std::unique_ptr<RunSamples> data;
  std::vector<Action> schedule;  // a training step's actions
  std::unique_ptr<ScheduleExecutor> executor;
  std::unique_ptr<Reporter> reporter;
};

}  // namespace mlptrain
