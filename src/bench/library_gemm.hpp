// A GEMM timed through the CPU library's own interface (oneDNN's matmul primitive, made once and
// run back to back, no dispatch of ours around it): the rate layerbench sets beside mlptrain's
// kernels on the same shapes, so the cost of going through the kernel interface shows.
#pragma once

#include <optional>
#include <string>

#include "kernels/kernels.hpp"

namespace mlptrain {

struct LibraryGemmTime {
  double best_ms = 0;
  std::string implementation;  // the library's name for the kernel it chose
};

// The fastest of `repeats` runs of `gemm` (its memory must be valid host memory); nothing when
// the library has no kernel for its element types on this CPU.
std::optional<LibraryGemmTime> time_library_gemm(const Gemm& gemm, int repeats);

}  // namespace mlptrain
