// Writes every rank's trace spans into one Chrome trace file (the JSON "traceEvents" format that
// Perfetto and chrome://tracing open): a process per rank, named by its place in the grid, with
// rows for computation, transfers and collectives; times in microseconds from an origin the
// ranks took together. scripts/tools/trace_timeline.py draws it and measures the pipeline bubble.
#pragma once

#include <mpi.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/process_grid.hpp"
#include "core/trace.hpp"

namespace mlptrain {

// Throws UsageError unless `path` can be created (checked before training, on rank 0).
void check_trace_path(const std::string& path);

// Collective over `world`: every rank's spans go to rank 0, which writes the file (to a temporary
// name, then renamed) with `run` (the layout and schedule) as its "otherData". Computations are
// complete ("X") events; transfers and collectives asynchronous begin/end pairs.
void write_trace(const std::string& path, const TraceRecorder& recorder, double origin_ms,
                 MPI_Comm world, const GridCoordinates& place, const nlohmann::json& run);

}  // namespace mlptrain
