// A Linear layer's biased GEMM in one pass through cuBLASLt: the bias is added to the fp32
// accumulator in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS) and the sum rounded once into the
// output, which is the precision contract's pre-activation (DESIGN.md §2.7) without writing the
// fp32 product and reading it again. Plans (descriptors, layouts and the heuristic's algorithm)
// are made once per shape, types and operand alignment.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "kernels/cuda/lt_support.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

class BiasedMatmul {
 public:
  BiasedMatmul(const lt::Context& context, bool tf32) : lt_(context), tf32_(tf32) {}
  ~BiasedMatmul();
  BiasedMatmul(const BiasedMatmul&) = delete;
  BiasedMatmul& operator=(const BiasedMatmul&) = delete;

  // Queues `gemm` (beta 0, with a bias) on the stream; false, with nothing queued, where cuBLASLt
  // has no algorithm for it (the caller adds the bias itself).
  bool run(const Gemm& gemm);

 private:
  // What a plan depends on: transposes, sizes, leading dimensions, types, and each pointer's
  // alignment (16 bytes or less), which the heuristic needs to know.
  using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         int, int, int, int, int>;
  lt::Plan make_plan(const Gemm& gemm);

  const lt::Context& lt_;
  bool tf32_;
  std::map<Key, lt::Plan> plans_;
};

}  // namespace mlptrain
