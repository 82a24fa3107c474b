// The CPU's fp8 kernels (Kernels::absolute_max, quantize_fp8, fp8_gemm, encode_fp8, decode_fp8):
// plain loops over the element types, row by row, with core/fp8.hpp's rounding. The fp8 GEMM is
// an exact emulation: the codes decoded to their values (every one a bf16 value), a bf16 GEMM
// of them with fp32 sums (the products exact), then the scales undone, the bias and what was
// there added in fp32 and the result rounded once.
#pragma once

#include <cstdint>
#include <functional>

#include "core/data_type.hpp"
#include "core/precision.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain::cpu_fp8 {

void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                  float* amax);
void quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
              const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes, float* inverse_scales);
// Both codings of quantize_fp8_pair in one pass over the operand, a tile of rows at a time.
void quantize_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                   const Fp8Coding& summed_columns, const Fp8Coding& summed_rows, Fp8CodeLayout summed_rows_layout);
// The largest |value| of `count` contiguous values, on the calling thread (a pass fused into
// another kernel's loop over rows it has in cache); the larger of two such maxima (NaN the
// largest of all).
float largest_magnitude(const void* data, DataType type, std::int64_t count);
float larger_magnitude(float a, float b);

// The emulated fp8 GEMM: its workspace (both operands' values in bf16, the fp32 sums), and the
// GEMM itself, whose bf16 product `bf16_gemm` computes.
std::size_t gemm_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k);
void gemm(const Fp8Gemm& call, const std::function<void(const Gemm&)>& bf16_gemm);

void encode(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
            std::uint8_t* codes);
void decode(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
            DataType type);

}  // namespace mlptrain::cpu_fp8
