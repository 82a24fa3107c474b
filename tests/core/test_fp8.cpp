// core/fp8.hpp against the formats' definitions: every finite value of e4m3 and e5m2 decoded from
// its bit pattern (OCP 8-bit floating point: e4m3 bias 7, no infinities, S.1111.111 the only NaN;
// e5m2 bias 15, IEEE-like), and the nearest of them found by scanning that table, ties to the
// pattern with an even mantissa, beyond the largest finite value saturated to it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/fp8.hpp"
#include "core/rng.hpp"

using namespace mlptrain;

namespace {

struct Fp8Value {
  float value;
  bool even;  // the mantissa's last bit is 0
};

// The format's non-negative finite values, from every bit pattern with the sign clear.
std::vector<Fp8Value> finite_values(Fp8Format format) {
  const int mantissa_bits = format == Fp8Format::e4m3 ? 3 : 2, bias = format == Fp8Format::e4m3 ? 7 : 15;
  const int exponent_bits = 7 - mantissa_bits;
  std::vector<Fp8Value> values;
  for (int pattern = 0; pattern < 128; ++pattern) {
    const int exponent = pattern >> mantissa_bits, mantissa = pattern & ((1 << mantissa_bits) - 1);
    const bool all_ones_exponent = exponent == (1 << exponent_bits) - 1;
    if (format == Fp8Format::e5m2 && all_ones_exponent) continue;                     // infinity, NaN
    if (format == Fp8Format::e4m3 && all_ones_exponent && mantissa == 7) continue;  // NaN
    const double significand = exponent == 0 ? mantissa / double(1 << mantissa_bits)
                                             : 1.0 + mantissa / double(1 << mantissa_bits);
    values.push_back({static_cast<float>(std::ldexp(significand, (exponent == 0 ? 1 : exponent) - bias)),
                      mantissa % 2 == 0});
  }
  return values;
}

float nearest_by_scan(float x, const std::vector<Fp8Value>& table) {
  const float magnitude = std::fabs(x);
  if (magnitude >= table.back().value) return std::copysign(table.back().value, x);
  const Fp8Value* best = &table.front();
  for (const Fp8Value& candidate : table) {
    const double distance = std::fabs(double(candidate.value) - magnitude), best_distance = std::fabs(double(best->value) - magnitude);
    if (distance < best_distance || (distance == best_distance && candidate.even && !best->even)) best = &candidate;
  }
  return std::copysign(best->value, x);
}

}  // namespace

TEST(Fp8, TablesHaveTheFormatsLargestAndSmallestValues) {
  const std::vector<Fp8Value> e4m3 = finite_values(Fp8Format::e4m3), e5m2 = finite_values(Fp8Format::e5m2);
  EXPECT_EQ(e4m3.size(), 127u);
  EXPECT_EQ(e4m3.back().value, 448.0f);
  EXPECT_EQ(e4m3[1].value, std::ldexp(1.0f, -9));
  EXPECT_EQ(e5m2.size(), 124u);
  EXPECT_EQ(e5m2.back().value, 57344.0f);
  EXPECT_EQ(e5m2[1].value, std::ldexp(1.0f, -16));
}

TEST(Fp8, RoundsToTheNearestValueTiesToEvenAndSaturates) {
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const std::vector<Fp8Value> table = finite_values(format);
    std::vector<float> cases;
    // Every value, every midpoint between neighbours and a float either side of it.
    for (std::size_t i = 0; i < table.size(); ++i) {
      cases.push_back(table[i].value);
      if (i + 1 == table.size()) continue;
      const float midpoint = (table[i].value + table[i + 1].value) / 2;
      cases.insert(cases.end(), {midpoint, std::nextafter(midpoint, 0.0f), std::nextafter(midpoint, 1e9f)});
    }
    // Random magnitudes from far below the smallest subnormal to far beyond the largest value.
    std::vector<float> uniform(20000);
    CounterRng(7, "fp8").fill_uniform(uniform.data(), 0, uniform.size(), -1.0f, 1.0f);
    for (std::size_t i = 0; i < uniform.size(); ++i)
      cases.push_back(std::ldexp(uniform[i], static_cast<int>(i % 44) - 24));
    cases.insert(cases.end(), {0.0f, 1e30f, std::numeric_limits<float>::denorm_min()});
    for (float x : cases)
      for (float signed_x : {x, -x}) {
        ASSERT_EQ(fp8::round_to(signed_x, format), nearest_by_scan(signed_x, table))
            << "x = " << signed_x << " format " << (format == Fp8Format::e4m3 ? "e4m3" : "e5m2");
        // The one-pass code is the rounded value's byte.
        ASSERT_EQ(fp8::code_of(signed_x, format), fp8::encode(fp8::round_to(signed_x, format), format))
            << "x = " << signed_x << " format " << (format == Fp8Format::e4m3 ? "e4m3" : "e5m2");
      }
  }
}

TEST(Fp8, ScaleIsTheLargestPowerOfTwoThatKeepsAmaxFinite) {
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const float largest = fp8::traits(format).largest;
    for (float amax : {1.0f, 3.0f, 447.0f, 448.0f, 449.0f, 1e-20f, 6.5e4f, 57344.0f, 1e20f, 0.3f}) {
      const float scale = fp8::scale_for(amax, format);
      EXPECT_EQ(scale, std::exp2(std::floor(std::log2(scale)))) << "a power of two";
      EXPECT_LE(amax * scale, largest) << amax;
      EXPECT_GT(amax * scale * 2, largest) << amax;
    }
    EXPECT_EQ(fp8::scale_for(0.0f, format), 1.0f);
  }
}

TEST(Fp8, BytesAreTheFormatsBitPatterns) {
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const std::vector<Fp8Value> table = finite_values(format);  // in the order of their patterns
    for (std::size_t pattern = 0; pattern < table.size(); ++pattern)
      for (float sign : {1.0f, -1.0f}) {
        const float value = sign * table[pattern].value;
        const auto expected = static_cast<std::uint8_t>(pattern | (sign < 0 ? 0x80u : 0u));
        if (value == 0.0f && sign < 0) continue;  // -0 compares equal to 0: its byte is 0x80 or 0
        ASSERT_EQ(fp8::encode(value, format), expected) << value;
        ASSERT_EQ(fp8::decode(expected, format), value) << int(expected);
      }
  }
}
