// The CPU's fp8 operand kernels (see fp8_kernels.hpp).
#include "kernels/cpu/fp8_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/elements.hpp"
#include "core/fp8.hpp"

namespace mlptrain::cpu_fp8 {

namespace {

// The index of the scale element (row, col) of an operand belongs to.
std::int64_t scale_index(Fp8Scaling scaling, std::int64_t row, std::int64_t col) {
  return scaling == Fp8Scaling::tensor ? 0 : scaling == Fp8Scaling::rows ? row : col;
}

}  // namespace

void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                  float* amax) {
  std::fill(amax, amax + fp8_scale_count(scaling, rows, cols), 0.0f);
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* values = elements<E>(data);
    for (std::int64_t row = 0; row < rows; ++row) {
      const auto* in = values + row * cols;
      if (scaling == Fp8Scaling::columns) {
        for (std::int64_t col = 0; col < cols; ++col) amax[col] = std::max(amax[col], std::fabs(E::load(in[col])));
        continue;
      }
      float largest = 0.0f;
      for (std::int64_t col = 0; col < cols; ++col) largest = std::max(largest, std::fabs(E::load(in[col])));
      float& into = amax[scaling == Fp8Scaling::rows ? row : 0];
      into = std::max(into, largest);
    }
  });
}

void quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
              const float* amax, Fp8Format format, void* quantized, float* inverse_scales) {
  const std::int64_t count = fp8_scale_count(scaling, rows, cols);
  std::vector<float> scales(static_cast<std::size_t>(count));
  for (std::int64_t index = 0; index < count; ++index) {
    scales[index] = fp8::scale_for(amax[index], format);
    inverse_scales[index] = 1.0f / scales[index];
  }
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* in = elements<E>(data);
    auto* out = elements<E>(quantized);
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::int64_t at = row * cols + col;
        out[at] = E::store(fp8::round_to(E::load(in[at]) * scales[scale_index(scaling, row, col)], format));
      }
  });
}

void unscale_product(const float* accumulator, std::int64_t rows, std::int64_t cols, const float* row_inverse,
                     Fp8Scaling row_scales, const float* column_inverse, Fp8Scaling column_scales, const void* bias,
                     void* c, DataType c_type, bool accumulate) {
  with_element(c_type, [&](auto element) {
    using E = decltype(element);
    auto* out = elements<E>(c);
    const auto* bias_values = elements<E>(bias);
    for (std::int64_t row = 0; row < rows; ++row) {
      const float row_factor = row_inverse[row_scales == Fp8Scaling::tensor ? 0 : row];
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::int64_t at = row * cols + col;
        float value = accumulator[at] * row_factor * column_inverse[column_scales == Fp8Scaling::tensor ? 0 : col];
        if (bias_values != nullptr) value += E::load(bias_values[col]);
        if (accumulate) value += E::load(out[at]);
        out[at] = E::store(value);
      }
    }
  });
}

}  // namespace mlptrain::cpu_fp8
