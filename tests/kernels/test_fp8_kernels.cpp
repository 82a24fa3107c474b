// The CPU's fp8 operand kernels against naive loops written from Kernels' contract: the amax of
// each scale's elements (one for all, one per row, one per column), the operand scaled by the
// power of two of core/fp8.hpp and rounded (its rounding is tested against the formats' tables
// in tests/core/test_fp8.cpp), and the product unscaled with the bias or the gradient already
// there added in fp32 and rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp8.hpp"
#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

using namespace mlptrain;

namespace {

constexpr std::int64_t rows = 5, cols = 7;

// bf16 values with magnitudes spread over six binades, and a row and a column far above the rest.
std::vector<std::uint16_t> operand() {
  std::vector<float> values(rows * cols);
  CounterRng(3, "fp8-kernels").fill_uniform(values.data(), 0, values.size(), -1.0f, 1.0f);
  std::vector<std::uint16_t> bits(values.size());
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    float value = std::ldexp(values[i], static_cast<int>(i % 6) - 3);
    if (i / cols == 2 || i % cols == 4) value *= 1000;
    store_element(bits.data(), i, DataType::bfloat16, value);
  }
  return bits;
}

std::int64_t scale_of(Fp8Scaling scaling, std::int64_t row, std::int64_t col) {
  return scaling == Fp8Scaling::tensor ? 0 : scaling == Fp8Scaling::rows ? row : col;
}

}  // namespace

TEST(Fp8Kernels, AmaxAndQuantizedValuesFollowEachScalesElements) {
  const auto kernels = make_cpu_kernels();
  const std::vector<std::uint16_t> data = operand();
  for (Fp8Scaling scaling : {Fp8Scaling::tensor, Fp8Scaling::rows, Fp8Scaling::columns})
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const std::int64_t count = fp8_scale_count(scaling, rows, cols);
      std::vector<float> expected_amax(count, 0.0f), amax(count, -1.0f), inverse(count);
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        float& into = expected_amax[scale_of(scaling, i / cols, i % cols)];
        into = std::max(into, std::fabs(load_element(data.data(), i, DataType::bfloat16)));
      }
      kernels->absolute_max(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data());
      ASSERT_EQ(amax, expected_amax);
      std::vector<std::uint16_t> quantized(data.size());
      kernels->quantize_fp8(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data(), format, quantized.data(),
                            inverse.data());
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        const std::int64_t scale_at = scale_of(scaling, i / cols, i % cols);
        const float scale = fp8::scale_for(expected_amax[scale_at], format);
        ASSERT_EQ(inverse[scale_at] * scale, 1.0f);
        const float expected = fp8::round_to(load_element(data.data(), i, DataType::bfloat16) * scale, format);
        ASSERT_EQ(load_element(quantized.data(), i, DataType::bfloat16), expected) << i;
        // The largest element of each scale lands in the top half of the format's range.
        if (std::fabs(load_element(data.data(), i, DataType::bfloat16)) == expected_amax[scale_at]) {
          ASSERT_GE(std::fabs(expected) * 2, fp8::traits(format).largest);
        }
      }
    }
}

TEST(Fp8Kernels, UnscaledProductAddsBiasOrGradientInFloatAndRoundsOnce) {
  const auto kernels = make_cpu_kernels();
  std::vector<float> accumulator(rows * cols), row_inverse(rows), column_inverse(cols);
  CounterRng(5, "fp8-unscale").fill_uniform(accumulator.data(), 0, accumulator.size(), -300.0f, 300.0f);
  for (std::int64_t r = 0; r < rows; ++r) row_inverse[r] = std::ldexp(1.0f, -static_cast<int>(r));
  for (std::int64_t c = 0; c < cols; ++c) column_inverse[c] = std::ldexp(1.0f, static_cast<int>(c) - 3);
  std::vector<std::uint16_t> bias(cols);
  for (std::int64_t c = 0; c < cols; ++c) store_element(bias.data(), c, DataType::bfloat16, 0.1f * static_cast<float>(c));
  // bf16 output with a bias; fp32 output added to what is there.
  std::vector<std::uint16_t> pre(rows * cols);
  kernels->unscale_fp8_product(accumulator.data(), rows, cols, row_inverse.data(), Fp8Scaling::rows,
                               column_inverse.data(), Fp8Scaling::columns, bias.data(), pre.data(), DataType::bfloat16,
                               false);
  std::vector<float> grads(rows * cols, 0.25f), before = grads;
  kernels->unscale_fp8_product(accumulator.data(), rows, cols, row_inverse.data(), Fp8Scaling::tensor,
                               column_inverse.data(), Fp8Scaling::columns, nullptr, grads.data(), DataType::float32,
                               true);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t i = r * cols + c;
      const float unscaled = accumulator[i] * row_inverse[r] * column_inverse[c];  // exact: powers of two
      std::uint16_t expected;
      store_element(&expected, 0, DataType::bfloat16, unscaled + load_element(bias.data(), c, DataType::bfloat16));
      ASSERT_EQ(pre[i], expected) << i;
      ASSERT_EQ(grads[i], accumulator[i] * row_inverse[0] * column_inverse[c] + before[i]) << i;
    }
}
