// The trainer's sample reads timed on one core, as layerbench reports them beside a layer's
// kernels: the built-in datasets' samples and a uint8 HDF5 file held in memory.
#pragma once

#include <nlohmann/json.hpp>

namespace mlptrain {

// Milliseconds to read `rows` samples (every other one, in reverse: a shuffled batch's rows are
// not neighbours) of `in` inputs and their targets or labels, as the trainer reads them.
nlohmann::json sample_reads(long rows, long in, long out, int repeats);

}  // namespace mlptrain
