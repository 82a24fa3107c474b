// The CUDA backend's fp8 ops (Kernels::absolute_max, quantize_fp8, fp8_gemm, encode_fp8,
// decode_fp8), with core/fp8.hpp's rounding and codes, so that a GPU quantizes to the CPU's bits.
// The GEMM runs on the fp8 tensor cores through cuBLASLt (fp8_matmul.hpp); where cuBLASLt has no
// algorithm for a product (a classifier's 10 columns, e5m2 by e5m2, a GPU without fp8 tensor
// cores) it runs as the CPU's emulation does: the codes decoded to bf16, a bf16 GEMM with fp32
// sums, the scales undone, the bias and the gradient added and the result rounded once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "kernels/cuda/device_scratch.hpp"
#include "kernels/cuda/fp8_matmul.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

class CudaFp8 {
 public:
  // `bf16_gemm` queues a GEMM on the context's stream (the emulation's product).
  CudaFp8(const lt::Context& context, DeviceScratch& scratch, std::function<void(const Gemm&)> bf16_gemm)
      : stream_(context.stream), scratch_(scratch), bf16_gemm_(std::move(bf16_gemm)), matmul_(context) {}

  void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    float* amax);
  void quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes, float* inverse_scales);
  // Both codings in one pass (Kernels::quantize_fp8_pair): a tile read once, its as_is codes
  // written along the rows and its transposed ones through shared memory.
  void quantize_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                     const Fp8Coding& summed_columns, const Fp8Coding& summed_rows, Fp8CodeLayout summed_rows_layout);
  void gemm(const Fp8Gemm& call);
  void encode(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
              std::uint8_t* codes);
  void decode(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
              DataType type);

 private:
  void emulate_gemm(const Fp8Gemm& call);

  cudaStream_t stream_;
  DeviceScratch& scratch_;
  std::function<void(const Gemm&)> bf16_gemm_;
  Fp8Matmul matmul_;
};

}  // namespace mlptrain
