// The CPU's fp8 kernels (Kernels::absolute_max, quantize_fp8, unscale_fp8_product, encode_fp8,
// decode_fp8): plain
// loops over the element types, row by row, with core/fp8.hpp's rounding. An fp8 GEMM on the CPU
// is these around a bf16 GEMM of the quantized values, exact as the formats' values are bf16's.
#pragma once

#include <cstdint>

#include "core/data_type.hpp"
#include "core/precision.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain::cpu_fp8 {

void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                  float* amax);
void quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
              const float* amax, Fp8Format format, void* quantized, float* inverse_scales);
void unscale_product(const float* accumulator, std::int64_t rows, std::int64_t cols, const float* row_inverse,
                     Fp8Scaling row_scales, const float* column_inverse, Fp8Scaling column_scales, const void* bias,
                     void* c, DataType c_type, bool accumulate);

void encode(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
            std::uint8_t* codes);
void decode(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
            DataType type);

}  // namespace mlptrain::cpu_fp8
