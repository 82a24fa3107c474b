// The CPU's elementwise kernels and AdamW at bf16 and fp16 (DESIGN.md §2.7) against naive
// references with the rounding spelled out: each computes in fp32 on the widened inputs and rounds
// each stored result once. Results that are a rounded fp32 sum or product are compared exactly;
// those through GELU (an fp32 approximation accurate to a few float ulps) to within one step of
// the 16-bit format, since a value that close to a rounding midpoint may round either way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

using namespace mlptrain;

namespace {

const DataType half_types[] = {DataType::bfloat16, DataType::float16};

std::vector<float> random_values(std::size_t count, std::uint64_t seed, float bound) {
  std::vector<float> values(count);
  CounterRng(seed, "half-kernels").fill_uniform(values.data(), 0, count, -bound, bound);
  return values;
}

// Values rounded to `type` (as bits) and their widened fp32 values.
struct Rounded {
  std::vector<std::uint16_t> bits;
  std::vector<float> widened;
};
Rounded rounded(const std::vector<float>& values, DataType type) {
  Rounded result{std::vector<std::uint16_t>(values.size()), std::vector<float>(values.size())};
  for (std::size_t i = 0; i < values.size(); ++i) {
    store_element(result.bits.data(), i, type, values[i]);
    result.widened[i] = load_element(result.bits.data(), i, type);
  }
  return result;
}

double gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_derivative(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

// One step of `type` at `value`: the distance to the next representable magnitude.
double step_at(double value, DataType type) {
  const int bits = type == DataType::bfloat16 ? 8 : 11;
  const double smallest_normal = std::ldexp(1.0, type == DataType::bfloat16 ? -126 : -14);
  const double magnitude = std::max(std::abs(value), smallest_normal);
  return std::ldexp(1.0, std::ilogb(magnitude) + 1 - bits);
}

class HalfKernels : public ::testing::TestWithParam<DataType> {
 protected:
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  DataType type = GetParam();
  float load(const std::vector<std::uint16_t>& bits, std::size_t i) const { return load_element(bits.data(), i, type); }
  float round(float value) const {
    std::uint32_t bits = 0;  // room for any element type (the compiler cannot tell `type` is 16-bit)
    store_element(&bits, 0, type, value);
    return load_element(&bits, 0, type);
  }
};

TEST_P(HalfKernels, GeluForwardRoundsTheGeluOfTheStoredPreActivation) {
  const std::int64_t rows = 5, cols = 37;
  const Rounded pre = rounded(random_values(rows * cols, 1, 3.0f), type);
  std::vector<std::uint16_t> activated(rows * cols);
  kernels->gelu_forward(pre.bits.data(), activated.data(), rows, cols, type);
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const double exact = gelu(pre.widened[i]);
    ASSERT_LE(std::abs(load(activated, i) - exact), step_at(exact, type)) << i;
  }
}

// Every finite value of the type as a pre-activation (the kernels look 16-bit GELU up in tables
// of all of them): the output, and d(pre) for an upstream gradient of 1, within half a step of
// the double-precision value plus fp32's few ulps (of the derivative's two terms: they cancel
// near x = -0.75), so a misplaced or stale entry fails.
TEST_P(HalfKernels, GeluOfEveryFiniteValueIsRoundedToNearest) {
  std::vector<std::uint16_t> every(1u << 16), pre, ones;
  for (std::size_t bits = 0; bits < every.size(); ++bits) every[bits] = static_cast<std::uint16_t>(bits);
  for (std::size_t i = 0; i < every.size(); ++i)
    if (std::isfinite(load(every, i))) pre.push_back(every[i]);
  const auto count = static_cast<std::int64_t>(pre.size());
  ones.resize(pre.size());
  for (std::int64_t i = 0; i < count; ++i) store_element(ones.data(), i, type, 1.0f);
  std::vector<std::uint16_t> activated(pre.size()), grad_pre(pre.size());
  std::vector<float> bias_grad(1);
  kernels->gelu_forward(pre.data(), activated.data(), count, 1, type);
  kernels->gelu_backward(ones.data(), pre.data(), grad_pre.data(), type, bias_grad.data(), DataType::float32, false,
                         count, 1);
  for (std::int64_t i = 0; i < count; ++i) {
    const double x = load_element(pre.data(), i, type);
    const double output = gelu(x), derivative = gelu_derivative(x);
    const double output_bound = 0.5 * step_at(output, type) + 4e-7 * std::abs(output);
    const double terms = 0.5 * std::erfc(-x / std::sqrt(2.0)) + std::abs(derivative - 0.5 * std::erfc(-x / std::sqrt(2.0)));
    const double derivative_bound = 0.5 * step_at(derivative, type) + 4e-7 * terms;
    ASSERT_LE(std::abs(load(activated, i) - output), output_bound) << "GELU(" << x << ")";
    ASSERT_LE(std::abs(load(grad_pre, i) - derivative), derivative_bound) << "GELU'(" << x << ")";
  }
}

// The pre-activation of §2.7: x W^T + b summed in fp32 and rounded once. Against a reference
// summed in double: every element is within half a step plus the fp32 sum's error (a value that
// close to a midpoint may round either way), and where the reference's rounding is clear of
// every midpoint the result equals it. The product rounded before the bias (two roundings)
// differs on many of those elements: the check tells the two apart.
TEST_P(HalfKernels, GemmAddsTheBiasInFloatAndRoundsOnce) {
  const std::int64_t m = 24, n = 40, k = 64;
  const Rounded a = rounded(random_values(m * k, 7, 1.0f), type), b = rounded(random_values(n * k, 8, 1.0f), type);
  const Rounded bias = rounded(random_values(n, 9, 1.0f), type);
  std::vector<std::uint16_t> c(m * n);
  kernels->gemm({.transpose_b = Transpose::yes, .m = m, .n = n, .k = k, .a = a.bits.data(), .lda = k,
                 .b = b.bits.data(), .ldb = k, .c = c.data(), .ldc = n, .input = type, .output = type,
                 .bias = bias.bits.data()});
  int clear = 0, product_first_differs = 0;
  for (std::int64_t row = 0; row < m; ++row)
    for (std::int64_t col = 0; col < n; ++col) {
      double product = 0, magnitude = std::abs(bias.widened[col]);
      for (std::int64_t i = 0; i < k; ++i) {
        const double term = static_cast<double>(a.widened[row * k + i]) * b.widened[col * k + i];
        product += term;
        magnitude += std::abs(term);
      }
      const double exact = product + bias.widened[col];
      const double sum_error = 2.0 * static_cast<double>(k) * std::ldexp(magnitude, -24);
      const float result = load(c, row * n + col);
      ASSERT_LE(std::abs(result - exact), 0.5 * step_at(exact, type) + sum_error) << row << "," << col;
      const float expected = round(static_cast<float>(exact));
      if (std::abs(std::abs(expected - exact) - 0.5 * step_at(exact, type)) <= sum_error) continue;
      ++clear;
      ASSERT_EQ(result, expected) << row << "," << col;
      product_first_differs += round(round(static_cast<float>(product)) + bias.widened[col]) != expected ? 1 : 0;
    }
  EXPECT_GT(clear, m * n / 2);  // fp16's finer step leaves more elements near a midpoint
  EXPECT_GT(product_first_differs, clear / 20) << "the product rounded first would pass as well";
}

TEST_P(HalfKernels, GeluBackwardRoundsEachGradientAndSumsTheRoundedOnesInFloat) {
  const std::int64_t rows = 6, cols = 29;
  const Rounded upstream = rounded(random_values(rows * cols, 3, 1.0f), type);
  const Rounded pre = rounded(random_values(rows * cols, 4, 3.0f), type);
  std::vector<std::uint16_t> grad_pre(rows * cols);
  std::vector<float> bias_grad(cols, 0.25f);  // accumulated onto
  kernels->gelu_backward(upstream.bits.data(), pre.bits.data(), grad_pre.data(), type, bias_grad.data(),
                         DataType::float32, true, rows, cols);
  std::vector<float> sums(cols, 0.25f);
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t col = 0; col < cols; ++col) {
      const std::int64_t i = row * cols + col;
      const double exact = upstream.widened[i] * gelu_derivative(pre.widened[i]);
      ASSERT_LE(std::abs(load(grad_pre, i) - exact), step_at(exact, type)) << i;
      sums[col] += load(grad_pre, i);  // the stored gradients, row by row in fp32
    }
  for (std::int64_t col = 0; col < cols; ++col) EXPECT_EQ(bias_grad[col], sums[col]) << col;
}

TEST_P(HalfKernels, FlatOpsRoundOnce) {
  const std::size_t count = 301;
  Rounded a = rounded(random_values(count, 5, 4.0f), type);
  const Rounded b = rounded(random_values(count, 6, 4.0f), type);
  const std::vector<float> a_in = a.widened;
  double squares = 0;
  for (float value : a_in) squares += static_cast<double>(value) * value;
  EXPECT_NEAR(kernels->sum_of_squares(a.bits.data(), type, count), squares, 1e-12 * squares);
  kernels->add(a.bits.data(), b.bits.data(), type, count);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(load(a.bits, i), round(a_in[i] + b.widened[i])) << i;
  std::vector<float> before(count);
  for (std::size_t i = 0; i < count; ++i) before[i] = load(a.bits, i);
  kernels->scale(a.bits.data(), type, count, 0.3f);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(load(a.bits, i), round(before[i] * 0.3f)) << i;
  kernels->fill(a.bits.data(), type, count, 0.1f);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(load(a.bits, i), round(0.1f)) << i;
}

// MoE's combine: each token's rows scaled and summed in fp32 in list order by FMAs after the
// first term (here not ascending, and with a token of no rows: zeros), stored rounded once to the
// half type or as fp32.
TEST_P(HalfKernels, SumTokenRowsAddsInFloatInListOrderAndRoundsOnce) {
  const std::int64_t sources = 7, cols = 37, tokens = 4;
  const Rounded source = rounded(random_values(static_cast<std::size_t>(sources * cols), 11, 3.0f), type);
  const std::vector<float> scales = random_values(static_cast<std::size_t>(sources), 12, 1.0f);
  const std::vector<std::int32_t> row_begin{0, 3, 3, 4, 7}, rows{5, 0, 2, 6, 1, 4, 3};
  for (bool scaled : {false, true}) {
    std::vector<float> sums(static_cast<std::size_t>(tokens * cols));
    for (std::int64_t token = 0; token < tokens; ++token)
      for (std::int64_t col = 0; col < cols; ++col) {
        float sum = 0.0f;
        for (std::int32_t entry = row_begin[token]; entry < row_begin[token + 1]; ++entry) {
          const float factor = scaled ? scales[rows[entry]] : 1.0f;
          const float value = source.widened[static_cast<std::size_t>(rows[entry] * cols + col)];
          sum = entry == row_begin[token] ? factor * value : std::fma(factor, value, sum);
        }
        sums[static_cast<std::size_t>(token * cols + col)] = sum;
      }
    std::vector<std::uint16_t> half(sums.size(), 0x7777);  // garbage: every row is written
    std::vector<float> full(sums.size(), 7.0f);
    const float* factors = scaled ? scales.data() : nullptr;
    kernels->sum_token_rows(source.bits.data(), type, row_begin.data(), rows.data(), factors, half.data(), type,
                            tokens, cols);
    kernels->sum_token_rows(source.bits.data(), type, row_begin.data(), rows.data(), factors, full.data(),
                            DataType::float32, tokens, cols);
    for (std::size_t i = 0; i < sums.size(); ++i) {
      ASSERT_EQ(full[i], sums[i]) << i;
      ASSERT_EQ(load(half, i), round(sums[i])) << i;
    }
  }
}

TEST_P(HalfKernels, AdamwUpdatesFloatMastersFromWidenedGradientsAndRoundsTheCopy) {
  const std::size_t count = 4133;  // several blocks and a ragged end
  const std::vector<float> start = random_values(count, 7, 0.5f);
  const Rounded grads = rounded(random_values(count, 8, 0.01f), type);
  const AdamWStep settings{.learning_rate = 1e-2, .step = 3};
  // The reference: fp32 AdamW on the widened gradients, no copy.
  std::vector<float> expected = start, m(count, 1e-3f), v(count, 1e-6f);
  const double expected_sum = kernels->adamw(expected.data(), grads.widened.data(), DataType::float32, m.data(), v.data(),
                                             count, settings, nullptr, DataType::float32);
  std::vector<float> master = start, m16(count, 1e-3f), v16(count, 1e-6f);
  std::vector<std::uint16_t> copy(count);
  const double sum = kernels->adamw(master.data(), grads.bits.data(), type, m16.data(), v16.data(), count, settings,
                                    copy.data(), type);
  EXPECT_EQ(sum, expected_sum);
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(master[i], expected[i]) << i;
    ASSERT_EQ(m16[i], m[i]) << i;
    ASSERT_EQ(load(copy, i), round(master[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, HalfKernels, ::testing::ValuesIn(half_types),
                         [](const auto& info) { return std::string(data_type_name(info.param)); });

TEST(AdamwGradScale, ScaledGradientsTimesTheInverseScaleUpdateAsUnscaledOnes) {
  // A loss scale is a power of two: scaling and unscaling are exact, so the update is the same.
  const auto kernels = make_cpu_kernels();
  const std::size_t count = 517;
  const std::vector<float> start = random_values(count, 9, 0.5f), grads = random_values(count, 10, 0.01f);
  std::vector<float> scaled(count);
  for (std::size_t i = 0; i < count; ++i) scaled[i] = grads[i] * 1024.0f;
  std::vector<float> plain = start, unscaled = start, m1(count, 0), v1(count, 0), m2(count, 0), v2(count, 0);
  const double plain_sum = kernels->adamw(plain.data(), grads.data(), DataType::float32, m1.data(), v1.data(), count,
                                          AdamWStep{}, nullptr, DataType::float32);
  const double unscaled_sum = kernels->adamw(unscaled.data(), scaled.data(), DataType::float32, m2.data(), v2.data(),
                                             count, AdamWStep{.grad_scale = 1.0f / 1024.0f}, nullptr, DataType::float32);
  EXPECT_EQ(plain_sum, unscaled_sum);
  EXPECT_EQ(plain, unscaled);
}

}  // namespace
