// The CPU kernels' 16-bit floats: conversions against a naive reference that decodes every bit
// pattern of the format and picks the nearest value by hand, and the GEMMs with bf16 and fp16
// inputs against double-precision sums of the same (widened) inputs. Also the properties of the
// oneDNN GEMMs the equivalence figures rest on: a row's result does not depend on the other rows
// of the call, and the primitive cache stays bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/onednn_matmul.hpp"
#include "kernels/kernels.hpp"

using namespace mlptrain;

namespace {

// A 16-bit float format: `exponent_bits` and `mantissa_bits` after the sign bit.
struct Format {
  DataType type;
  int exponent_bits;
  int mantissa_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
};
constexpr Format bfloat16_format{DataType::bfloat16, 8, 7};
constexpr Format float16_format{DataType::float16, 5, 10};

// The value of a bit pattern, from the format's definition (infinity as such, NaN as NaN).
double decode(const Format& format, std::uint16_t bits) {
  const int exponent = (bits >> format.mantissa_bits) & ((1 << format.exponent_bits) - 1);
  const int mantissa = bits & ((1 << format.mantissa_bits) - 1);
  const double sign = (bits >> 15) != 0 ? -1.0 : 1.0;
  const double unit = std::ldexp(1.0, -format.mantissa_bits);
  if (exponent == (1 << format.exponent_bits) - 1)
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (exponent == 0) return sign * mantissa * unit * std::ldexp(1.0, 1 - format.bias());
  return sign * (1.0 + mantissa * unit) * std::ldexp(1.0, exponent - format.bias());
}

// Round to nearest, ties to the even bit pattern, by search over every non-negative pattern.
// Infinity counts as the value one step above the largest finite one, so that what lies at or
// beyond half a step past the largest value rounds to it, as IEEE 754 says.
class NaiveRounding {
 public:
  explicit NaiveRounding(const Format& format) {
    const std::uint16_t infinity = static_cast<std::uint16_t>(((1 << format.exponent_bits) - 1) << format.mantissa_bits);
    for (std::uint16_t bits = 0; bits < infinity; ++bits) values_.emplace(decode(format, bits), bits);
    const double largest = decode(format, infinity - 1), step = largest - decode(format, infinity - 2);
    values_.emplace(largest + step, infinity);
    infinity_ = infinity;
  }

  std::uint16_t round(float value) const {
    if (std::isnan(value)) return 0xffff;  // any NaN: compared as "is NaN" below
    const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
    const double magnitude = std::abs(static_cast<double>(value));
    if (std::isinf(value)) return sign | infinity_;
    auto above = values_.lower_bound(magnitude);
    if (above == values_.end()) return sign | infinity_;
    if (above->first == magnitude || above == values_.begin()) return sign | above->second;
    auto below = std::prev(above);
    const double up = above->first - magnitude, down = magnitude - below->first;
    if (up != down) return sign | (up < down ? above->second : below->second);
    return sign | ((below->second & 1) == 0 ? below->second : above->second);
  }

 private:
  std::map<double, std::uint16_t> values_;
  std::uint16_t infinity_ = 0;
};

// Floats that exercise every case: random bit patterns of every exponent, the midpoints between
// neighbouring 16-bit values (exact ties), subnormals, the overflow boundary, zeros, infinities.
std::vector<float> probe_values(const Format& format) {
  std::vector<float> values;
  const CounterRng random(5, "probe-bits");
  for (std::uint64_t index = 0; index < 20000; ++index)
    values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(random.below(index, std::uint64_t{1} << 32))));
  const std::uint32_t infinity = ((1u << format.exponent_bits) - 1) << format.mantissa_bits;
  for (std::uint32_t pattern = 0; pattern + 1 < infinity; pattern += 7) {
    const double low = decode(format, static_cast<std::uint16_t>(pattern));
    const double high = decode(format, static_cast<std::uint16_t>(pattern + 1));
    for (double value : {low, (low + high) / 2, std::nextafter((low + high) / 2, 0.0), std::nextafter((low + high) / 2, 1e300)}) {
      values.push_back(static_cast<float>(value));
      values.push_back(static_cast<float>(-value));
    }
  }
  for (float value : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                      65504.0f, 65519.99f, 65520.0f, 65536.0f, 3.3895314e38f, 3.4e38f})
    values.push_back(value);
  return values;
}

void check_rounding(const Format& format, std::uint16_t (*scalar)(float), float (*widen)(std::uint16_t)) {
  const NaiveRounding naive(format);
  const std::vector<float> values = probe_values(format);
  std::vector<std::uint16_t> vectorized(values.size());
  const auto kernels = make_cpu_kernels();
  kernels->convert(values.data(), DataType::float32, vectorized.data(), format.type, values.size());
  std::vector<float> back(values.size());
  kernels->convert(vectorized.data(), format.type, back.data(), DataType::float32, values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t expected = naive.round(values[i]);
    if (std::isnan(values[i])) {
      EXPECT_TRUE(std::isnan(widen(scalar(values[i])))) << values[i];
      EXPECT_TRUE(std::isnan(back[i]));
      continue;
    }
    ASSERT_EQ(scalar(values[i]), expected) << std::hexfloat << values[i];
    ASSERT_EQ(vectorized[i], expected) << std::hexfloat << values[i];
    // Widening is exact: the decoded value of the pattern.
    ASSERT_EQ(static_cast<double>(back[i]), decode(format, expected)) << std::hexfloat << values[i];
  }
}

// Values rounded to the 16-bit float `type`, as its bits.
std::vector<std::uint16_t> half_matrix(const std::vector<float>& values, DataType type, Kernels& kernels) {
  std::vector<std::uint16_t> half(values.size());
  kernels.convert(values.data(), DataType::float32, half.data(), type, values.size());
  return half;
}

// A GEMM operand of `type`: its memory, and its values as the GEMM reads them (rounded).
class Operand {
 public:
  Operand(std::vector<float> values, DataType type, Kernels& kernels) : values_(std::move(values)) {
    if (!is_half(type)) return;
    half_ = half_matrix(values_, type, kernels);
    kernels.convert(half_.data(), type, values_.data(), DataType::float32, values_.size());
  }
  const void* data() const { return half_.empty() ? static_cast<const void*>(values_.data()) : half_.data(); }
  float at(std::int64_t i) const { return values_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<float> values_;
  std::vector<std::uint16_t> half_;
};

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values(count);
  CounterRng(seed, "half-gemm").fill_uniform(values.data(), 0, count, -2.0f, 2.0f);
  return values;
}

}  // namespace

TEST(HalfPrecision, Bfloat16RoundsToNearestEvenAsTheNaiveReference) {
  check_rounding(bfloat16_format, round_to_bfloat16, bfloat16_to_float);
}

TEST(HalfPrecision, Float16RoundsToNearestEvenAsTheNaiveReference) {
  check_rounding(float16_format, round_to_float16, float16_to_float);
}

TEST(HalfPrecision, WideningIsExactForEveryBitPattern) {
  for (const Format& format : {bfloat16_format, float16_format}) {
    const auto widen = format.type == DataType::bfloat16 ? bfloat16_to_float : float16_to_float;
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      const double expected = decode(format, static_cast<std::uint16_t>(bits));
      const float widened = widen(static_cast<std::uint16_t>(bits));
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(widened)) << bits;
      } else {
        ASSERT_EQ(static_cast<double>(widened), expected) << bits;
        ASSERT_EQ(std::signbit(widened), (bits & 0x8000) != 0) << bits;
      }
    }
  }
}

// Half inputs, fp32 accumulation: the result is the double-precision sum of the widened
// products within fp32 accumulation error, and a half output is that result rounded once.
TEST(HalfPrecision, HalfGemmsAccumulateInFloat) {
  const auto kernels = make_cpu_kernels();
  const std::int64_t m = 33, n = 47, k = 300;
  for (const Format& format : {bfloat16_format, float16_format}) {
    const auto widen = format.type == DataType::bfloat16 ? bfloat16_to_float : float16_to_float;
    const auto round = format.type == DataType::bfloat16 ? round_to_bfloat16 : round_to_float16;
    for (Transpose ta : {Transpose::no, Transpose::yes}) {
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        const auto a = half_matrix(random_values(m * k, 1), format.type, *kernels);
        const auto b = half_matrix(random_values(k * n, 2), format.type, *kernels);
        const std::int64_t lda = ta == Transpose::no ? k : m, ldb = tb == Transpose::no ? n : k;
        std::vector<float> c(m * n);
        std::vector<std::uint16_t> c_half(m * n);
        Gemm gemm{.transpose_a = ta, .transpose_b = tb, .m = m, .n = n, .k = k, .a = a.data(), .lda = lda,
                  .b = b.data(), .ldb = ldb, .c = c.data(), .ldc = n, .input = format.type};
        kernels->gemm(gemm);
        gemm.c = c_half.data();
        gemm.output = format.type;
        kernels->gemm(gemm);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double sum = 0, magnitude = 0;
            for (std::int64_t p = 0; p < k; ++p) {
              const double av = widen(ta == Transpose::no ? a[i * k + p] : a[p * m + i]);
              const double bv = widen(tb == Transpose::no ? b[p * n + j] : b[j * k + p]);
              sum += av * bv;
              magnitude += std::abs(av * bv);
            }
            // k additions in fp32, each off by at most half an ulp of the running sum.
            const double accumulation = k * std::ldexp(magnitude, -24);
            ASSERT_NEAR(c[i * n + j], sum, accumulation) << data_type_name(format.type);
            // The half output is the fp32 result rounded once (the same accumulation).
            ASSERT_EQ(c_half[i * n + j], round(c[i * n + j])) << data_type_name(format.type);
          }
      }
    }
  }
}

// Data parallelism splits a micro-batch's rows over ranks: the equivalence figures rely on a
// row's product not depending on how many rows the call holds (with a fixed thread count). It
// holds exactly wherever the library runs both row counts on one kernel (fp32 always here; bf16
// on CPUs without AMX). Where it picks another kernel for fewer rows (AMX for many, AVX-512 for
// one), the two are the same fp32 sums in other orders: each within k u of the exact sum of
// magnitudes (u = 2^-24), so within twice that of each other.
TEST(HalfPrecision, RowsDoNotDependOnTheRestOfTheCall) {
  OneDnnMatmul matmul;
  for (DataType type : {DataType::float32, DataType::bfloat16}) {
    for (const auto& [in, out] : {std::pair{64, 48}, {1024, 1024}, {24, 10}}) {
      const std::int64_t rows = 256;
      const auto kernels = make_cpu_kernels();
      const auto x = random_values(rows * in, 3), w = random_values(out * in, 4);
      const bool half = is_half(type);
      const auto x_half = half ? half_matrix(x, type, *kernels) : std::vector<std::uint16_t>{};
      const auto w_half = half ? half_matrix(w, type, *kernels) : std::vector<std::uint16_t>{};
      const void* x_data = half ? static_cast<const void*>(x_half.data()) : x.data();
      const void* w_data = half ? static_cast<const void*>(w_half.data()) : w.data();
      const std::size_t element = size_of(type);
      // The magnitudes' sums, of the values the GEMM multiplies.
      const auto value = [&](const std::vector<float>& floats, const std::vector<std::uint16_t>& halves, std::size_t i) {
        return half ? static_cast<double>(bfloat16_to_float(halves[i])) : static_cast<double>(floats[i]);
      };
      std::vector<float> whole(rows * out), part(rows * out);
      const auto gemm = [&](std::int64_t first, std::int64_t count, float* into) {
        return Gemm{.transpose_b = Transpose::yes, .m = count, .n = out, .k = in,
                    .a = static_cast<const char*>(x_data) + first * in * element, .lda = in,
                    .b = w_data, .ldb = in, .c = into, .ldc = out, .input = type};
      };
      matmul.run(gemm(0, rows, whole.data()));
      const std::string whole_kernel = matmul.implementation_of(gemm(0, rows, whole.data()));
      for (std::int64_t count : {1, 7, 64, 128, 255}) {
        const std::int64_t first = rows - count;
        matmul.run(gemm(first, count, part.data()));
        const bool same_kernel = matmul.implementation_of(gemm(first, count, part.data())) == whole_kernel;
        if (type == DataType::float32) ASSERT_TRUE(same_kernel) << "fp32 rows " << count << " run on another kernel";
        for (std::int64_t i = 0; i < count * out; ++i) {
          if (same_kernel) {
            ASSERT_EQ(part[i], whole[first * out + i]) << data_type_name(type) << " rows " << count;
            continue;
          }
          const std::int64_t row = first + i / out, col = i % out;
          double magnitude = 0;
          for (std::int64_t p = 0; p < in; ++p)
            magnitude += std::abs(value(x, x_half, static_cast<std::size_t>(row * in + p)) *
                                  value(w, w_half, static_cast<std::size_t>(col * in + p)));
          ASSERT_NEAR(part[i], whole[first * out + i], 2 * in * std::ldexp(magnitude, -24))
              << data_type_name(type) << " rows " << count << " (another kernel)";
        }
      }
    }
  }
}

TEST(HalfPrecision, PrimitiveCacheStaysBounded) {
  OneDnnMatmul matmul;
  const auto most_rows = static_cast<std::int64_t>(OneDnnMatmul::capacity) + 4;
  const std::vector<float> a(static_cast<std::size_t>(most_rows), 1.0f), b = {0.5f, 0.25f};
  std::vector<float> c(static_cast<std::size_t>(most_rows * 2));
  // A new row count each call, as an MoE expert sees with each routing: more problems than fit.
  for (std::int64_t rows = 1; rows <= most_rows; ++rows) {
    matmul.run({.m = rows, .n = 2, .k = 1, .a = a.data(), .lda = 1, .b = b.data(), .ldb = 2,
                .c = c.data(), .ldc = 2});
    ASSERT_EQ(c[static_cast<std::size_t>((rows - 1) * 2 + 1)], 0.25f) << rows;
    ASSERT_LE(matmul.cached(), OneDnnMatmul::capacity);
  }
  EXPECT_EQ(matmul.cached(), OneDnnMatmul::capacity);
}

// An MoE expert's GEMMs see a new row count with each routing: a varying m (forward, input
// gradient) runs in blocks through fewer than 2 row_block primitives, a varying k (weight gradient,
// accumulated or not) through one a beta, whatever the count; the results match sums in double.
TEST(HalfPrecision, VaryingDimensionsArePlannedOnce) {
  const auto kernels = make_cpu_kernels();
  for (DataType type : {DataType::float32, DataType::bfloat16}) {
    const std::int64_t most = 4 * OneDnnMatmul::row_block + 11, n = 24, width = 40;
    const Operand rows(random_values(static_cast<std::size_t>(most * width), 7), type, *kernels);
    const Operand other(random_values(static_cast<std::size_t>(most * n), 8), type, *kernels);
    // Within the error of an fp32 sum of `terms` terms of these magnitudes.
    const auto close = [](double got, double exact, double magnitude, std::int64_t terms) {
      return std::abs(got - exact) <= 2.0 * static_cast<double>(terms) * std::ldexp(magnitude, -24);
    };
    OneDnnMatmul by_rows, by_inner;
    std::vector<float> c(static_cast<std::size_t>(most * n)), sums(static_cast<std::size_t>(width * n), 0.0f);
    for (std::int64_t count = 1; count <= most; ++count) {
      // c [count, n] = rows [count, width] other [n, width]^T
      by_rows.run({.transpose_b = Transpose::yes, .m = count, .n = n, .k = width, .a = rows.data(), .lda = width,
                   .b = other.data(), .ldb = width, .c = c.data(), .ldc = n, .input = type, .varying = Varying::m});
      for (std::int64_t i = 0; i < count; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double exact = 0, magnitude = 0;
          for (std::int64_t l = 0; l < width; ++l) {
            const double term = static_cast<double>(rows.at(i * width + l)) * other.at(j * width + l);
            exact += term;
            magnitude += std::abs(term);
          }
          ASSERT_TRUE(close(c[static_cast<std::size_t>(i * n + j)], exact, magnitude, width)) << count << " " << i;
        }
      // sums [width, n] (+)= rows [count, width]^T other [count, n]: the weight gradient's shape,
      // accumulated at odd counts.
      const bool accumulate = count % 2 == 1;
      const std::vector<float> before = sums;
      by_inner.run({.transpose_a = Transpose::yes, .m = width, .n = n, .k = count, .a = rows.data(), .lda = width,
                    .b = other.data(), .ldb = n, .beta = accumulate ? 1.0f : 0.0f, .c = sums.data(), .ldc = n,
                    .input = type, .varying = Varying::k});
      for (std::int64_t i = 0; i < width; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double exact = accumulate ? before[static_cast<std::size_t>(i * n + j)] : 0.0, magnitude = std::abs(exact);
          for (std::int64_t l = 0; l < count; ++l) {
            const double term = static_cast<double>(rows.at(l * width + i)) * other.at(l * n + j);
            exact += term;
            magnitude += std::abs(term);
          }
          ASSERT_TRUE(close(sums[static_cast<std::size_t>(i * n + j)], exact, magnitude, count + 1)) << count;
        }
    }
    EXPECT_LT(by_rows.created(), static_cast<std::size_t>(2 * OneDnnMatmul::row_block)) << data_type_name(type);
    EXPECT_LE(by_inner.created(), 2u) << data_type_name(type);
  }
}
