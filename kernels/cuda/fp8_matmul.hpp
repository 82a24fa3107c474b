// The fp8 GEMM on Hopper's tensor cores through cuBLASLt (Kernels::fp8_gemm's contract): both
// operands' codes with the summed dimension contiguous (the "TN" form fp8 matmuls take), their
// inverse scales as cuBLASLt's A and B scale pointers (one each, or one per row as
// CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), the tensor cores' sums of about 14 bits moved into
// fp32 every 128 terms unless fast accumulation is asked (DESIGN.md 2.7), the bias in the epilogue, beta 1 where the product is added. Plans are
// made once per shape, formats, scales and alignment; where cuBLASLt has no algorithm (e5m2 by
// e5m2, a leading dimension that is not a multiple of 16 bytes, a GPU before sm_89) the caller
// takes its other path.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "kernels/cuda/lt_support.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

class Fp8Matmul {
 public:
  explicit Fp8Matmul(const lt::Context& context) : lt_(context) {}
  ~Fp8Matmul();
  Fp8Matmul(const Fp8Matmul&) = delete;
  Fp8Matmul& operator=(const Fp8Matmul&) = delete;

  // Queues `gemm` on the stream; false, with nothing queued, where cuBLASLt has no algorithm.
  bool run(const Fp8Gemm& gemm);

 private:
  // Sizes, formats, scale modes, output type, bias, accumulation, fast accumulation, and the
  // codes' and output's alignment.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, int, int, int, bool, bool, bool, int, int,
                         int>;
  lt::Plan make_plan(const Fp8Gemm& gemm);

  const lt::Context& lt_;
  std::map<Key, lt::Plan> plans_;
};

}  // namespace mlptrain
