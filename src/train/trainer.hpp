// The common training loop: builds the run (grid, data, model, strategies, optimizer), then for
// every step executes the schedule's actions and calls the strategies' hooks at fixed points. It
// never names a strategy.
#pragma once

#include <mpi.h>

#include "core/config.hpp"

namespace mlptrain {

// How the run's communicators may work (a backend setting, not a training option).
struct CommSettings {
  bool shared_memory = true;  // node-local groups run collectives in shared-memory windows
};

// Runs (or, with --predict, only predicts) the configured training on the ranks of `world`.
// Collective; throws AgreedError for problems every rank agrees on.
void run_training(const Config& config, MPI_Comm world, const CommSettings& comm = {});

}  // namespace mlptrain
