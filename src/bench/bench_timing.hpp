// Timing as layerbench's processes do it: side by side, each run started at once on every
// process, the fastest run kept.
#pragma once

#include <mpi.h>

#include <algorithm>

#include "core/timer.hpp"

namespace mlptrain {

// Processes run side by side (mpiexec -n R, as R ranks of a node run) start each timed run at
// once, as a step's ranks run their kernels at once: the best run of one process is then not
// one during which the others happened to rest, and what they share (cores' execution units,
// memory bandwidth) shows.
inline void start_together() { MPI_Barrier(MPI_COMM_WORLD); }

// The fastest of `repeats` runs of `body`, each ended by `finish` (which waits for the device).
template <typename Body, typename Finish>
double best_ms(int repeats, Body&& body, Finish&& finish) {
  body();  // warm up
  finish();
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    start_together();
    const double start = now_ms();
    body();
    finish();
    best = std::min(best, now_ms() - start);
  }
  return best;
}

}  // namespace mlptrain
