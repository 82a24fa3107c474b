// What a run says about itself beyond each step: the header it starts with (layout, model, data,
// device and kernels, and every strategy's sentence), its prediction for this rank from the cost
// model (strategies/rank_plan.hpp, with what the MoE routing showed), the end-of-run summary's
// figures gathered from every rank, and the trace file.
#pragma once

#include <string>

#include "cost/prediction.hpp"
#include "report/reporter.hpp"
#include "train/run.hpp"

namespace mlptrain {

std::string describe_run(const Run& run);

Prediction predict_this_rank(const Run& run);

// Completes `summary` with the run's peaks (this rank's, in device and host memory), every
// rank's peaks (gathered: collective) and the prediction.
void complete_summary(Run& run, const MemoryByState& run_peak, RunSummary& summary);

// Writes the run's trace file, if it has a trace (collective).
void write_trace_file(Run& run);

}  // namespace mlptrain
