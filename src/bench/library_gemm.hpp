// GEMMs timed through the CPU library's own interface (oneDNN's matmul primitives, made once and
// run back to back, no dispatch of ours around them): the rate layerbench sets beside mlptrain's
// kernels on the same shapes, so the cost of going through the kernel interface shows. A list of
// GEMMs runs in its order over its own buffers, as a training step runs a model's layers.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"

namespace mlptrain {

struct LibraryGemmTime {
  double best_ms = 0;          // the fastest run of the whole list
  std::string implementation;  // the library's name for the kernel it chose for the first
};

// The fastest of `repeats` runs of `gemms` in order (their memory must be valid host memory),
// each begun by `start_together` (processes timing side by side start each run at once);
// nothing when the library has no kernel for one's element types on this CPU.
std::optional<LibraryGemmTime> time_library_gemms(const std::vector<Gemm>& gemms, int repeats,
                                                  const std::function<void()>& start_together);

}  // namespace mlptrain
