// The CPU's fp8 kernels against naive loops written from Kernels' contract: the amax of each
// scale's elements (one for all, one per row, one per column), the operand scaled by the power of
// two of core/fp8.hpp, rounded and coded (its rounding is tested against the formats' tables in
// tests/core/test_fp8.cpp), as it is or transposed, and the GEMM of codes unscaled with the bias
// or the gradient already there added in fp32 and rounded once.
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

TEST(Fp8Kernels, AmaxAndCodesFollowEachScalesElements) {
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
      for (Fp8CodeLayout layout : {Fp8CodeLayout::as_is, Fp8CodeLayout::transposed}) {
        std::vector<std::uint8_t> codes(data.size());
        kernels->quantize_fp8(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data(), format, layout,
                              codes.data(), inverse.data());
        for (std::int64_t i = 0; i < rows * cols; ++i) {
          const std::int64_t row = i / cols, col = i % cols, scale_at = scale_of(scaling, row, col);
          const float scale = fp8::scale_for(expected_amax[scale_at], format);
          ASSERT_EQ(inverse[scale_at] * scale, 1.0f);
          const float expected = fp8::round_to(load_element(data.data(), i, DataType::bfloat16) * scale, format);
          const std::int64_t at = layout == Fp8CodeLayout::as_is ? i : col * rows + row;
          ASSERT_EQ(fp8::decode(codes[at], format), expected) << i;
          // The largest element of each scale lands in the top half of the format's range.
          if (std::fabs(load_element(data.data(), i, DataType::bfloat16)) == expected_amax[scale_at]) {
            ASSERT_GE(std::fabs(expected) * 2, fp8::traits(format).largest);
          }
        }
      }
    }
}

// Across the transposing pass's tiles (64 x 64): every code lands at its transposed place.
TEST(Fp8Kernels, TransposedCodesCrossTiles) {
  const auto kernels = make_cpu_kernels();
  constexpr std::int64_t tall = 70, wide = 131;
  std::vector<float> values(tall * wide);
  CounterRng(9, "fp8-tiles").fill_uniform(values.data(), 0, values.size(), -4.0f, 4.0f);
  std::vector<std::uint16_t> data(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) store_element(data.data(), i, DataType::bfloat16, values[i]);
  std::vector<float> amax(wide), inverse(wide);
  kernels->absolute_max(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data());
  std::vector<std::uint8_t> as_is(data.size()), transposed(data.size());
  kernels->quantize_fp8(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::as_is, as_is.data(), inverse.data());
  kernels->quantize_fp8(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::transposed, transposed.data(), inverse.data());
  for (std::int64_t row = 0; row < tall; ++row)
    for (std::int64_t col = 0; col < wide; ++col) ASSERT_EQ(transposed[col * tall + row], as_is[row * wide + col]);
}

// The fp8 GEMM against a sum in double of the codes' decoded products, unscaled, with the bias or
// the gradient already there added, rounded once: within the fp32 sum's rounding (k terms, each
// step off by at most 2^-24 of the running magnitude) and one unit of the output's last place
// (where that sum's error crosses a rounding boundary). A scale applied twice, a transposed
// operand read as it is, or e5m2 codes read as e4m3 miss it by far.
TEST(Fp8Kernels, GemmOfCodesIsTheirUnscaledProductRoundedOnce) {
  const auto kernels = make_cpu_kernels();
  constexpr std::int64_t m = 6, n = 9, k = 40;
  const auto random_codes = [](std::size_t count, std::uint64_t seed) {
    std::vector<float> uniform(count);
    CounterRng(seed, "fp8-gemm-codes").fill_uniform(uniform.data(), 0, count, 0.0f, 256.0f);
    std::vector<std::uint8_t> codes(count);
    for (std::size_t i = 0; i < count; ++i) codes[i] = static_cast<std::uint8_t>(std::min(255.0f, uniform[i]));
    return codes;
  };
  std::vector<std::uint8_t> a = random_codes(m * k, 11), b = random_codes(n * k, 12);
  // No NaN codes (e4m3's S.1111.111); e5m2's infinities and NaNs are never produced either.
  for (auto& code : a)
    if ((code & 0x7f) == 0x7f) code ^= 1;
  for (auto& code : b)
    if ((code & 0x7c) == 0x7c) code &= 0xbb;
  std::vector<float> a_inverse(m), b_inverse(n);
  for (std::int64_t i = 0; i < m; ++i) a_inverse[i] = std::ldexp(1.0f, static_cast<int>(i) - 8);
  for (std::int64_t j = 0; j < n; ++j) b_inverse[j] = std::ldexp(1.0f, 2 - static_cast<int>(j));
  std::vector<std::uint16_t> bias(n);
  for (std::int64_t j = 0; j < n; ++j) store_element(bias.data(), j, DataType::bfloat16, 0.37f * static_cast<float>(j));
  // The same codes stored transposed ([k, m], [k, n]), as a backend that reads them through its
  // GEMM's strides takes them.
  std::vector<std::uint8_t> a_transposed(a.size()), b_transposed(b.size());
  for (std::int64_t p = 0; p < k; ++p) {
    for (std::int64_t i = 0; i < m; ++i) a_transposed[p * m + i] = a[i * k + p];
    for (std::int64_t j = 0; j < n; ++j) b_transposed[p * n + j] = b[j * k + p];
  }
  for (int variant = 0; variant < 4; ++variant) {
    const bool per_row = variant % 2 == 1, stored_transposed = variant >= 2;
    const Fp8Scaling scales = per_row ? Fp8Scaling::rows : Fp8Scaling::tensor;
    const Transpose stored = stored_transposed ? Transpose::yes : Transpose::no;
    std::vector<std::uint16_t> pre(m * n);
    std::vector<float> grads(m * n, 0.75f);
    std::vector<std::byte> workspace(kernels->fp8_gemm_workspace_bytes(m, n, k));
    Fp8Gemm call{.m = m,
                 .n = n,
                 .k = k,
                 .transpose_a = stored,
                 .transpose_b = stored,
                 .a = stored_transposed ? a_transposed.data() : a.data(),
                 .a_format = Fp8Format::e4m3,
                 .a_inverse = a_inverse.data(),
                 .a_scales = scales,
                 .b = stored_transposed ? b_transposed.data() : b.data(),
                 .b_format = Fp8Format::e5m2,
                 .b_inverse = b_inverse.data(),
                 .b_scales = scales,
                 .bias = bias.data(),
                 .c = pre.data(),
                 .c_type = DataType::bfloat16,
                 .workspace = workspace.data()};
    kernels->fp8_gemm(call);
    call.bias = nullptr;
    call.c = grads.data();
    call.c_type = DataType::float32;
    call.accumulate = true;
    kernels->fp8_gemm(call);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double product = static_cast<double>(fp8::decode(a[i * k + p], Fp8Format::e4m3)) *
                                 fp8::decode(b[j * k + p], Fp8Format::e5m2);
          sum += product;
          magnitude += std::fabs(product);
        }
        const double factor = static_cast<double>(a_inverse[per_row ? i : 0]) * b_inverse[per_row ? j : 0];
        const double accumulation = k * std::ldexp(magnitude, -24) * factor;
        const double with_bias = sum * factor + load_element(bias.data(), j, DataType::bfloat16);
        const double got = load_element(pre.data(), i * n + j, DataType::bfloat16);
        ASSERT_LE(std::fabs(got - with_bias), accumulation + std::ldexp(std::fabs(with_bias), -7)) << i << "," << j;
        const double added = sum * factor + 0.75;
        ASSERT_LE(std::fabs(grads[i * n + j] - added), accumulation + std::ldexp(std::fabs(added), -23))
            << i << "," << j;
      }
  }
}
