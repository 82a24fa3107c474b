// The common training loop: builds the run (train/run.hpp), then for every step executes the
// schedule's actions and calls the strategies' hooks at fixed points, agrees on the step's world
// sums and updates the parameters. It never names a strategy.
#pragma once

#include <mpi.h>

#include "core/config.hpp"
#include "core/error.hpp"
#include "device/compute_device.hpp"

namespace mlptrain {

// Runs (or, with --predict, only predicts) the configured training on the ranks of `world`.
// Collective; throws AgreedError for problems every rank agrees on. Returns ExitCode::stopped
// where a stop signal ended the run early (stop_signals.hpp), else success.
ExitCode run_training(const Config& config, MPI_Comm world, const CommSettings& comm = {});

}  // namespace mlptrain
