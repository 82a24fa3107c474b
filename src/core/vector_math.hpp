// Branch-free float approximations of exp, log, sin/cos, the Gaussian CDF and GELU's derivative,
// written as plain inline arithmetic so that loops calling them vectorize (a scalar libm call per
// element would not). Each is accurate to a few float ulps and is tested against double-precision
// libm.
#pragma once

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstdint>

namespace mlptrain::vector_math {

inline constexpr float ln2_high = 0.693145751953125f;
inline constexpr float ln2_low = 1.428606765330187e-06f;
inline constexpr float log2_e = 1.4426950408889634f;
inline constexpr float two_pi = 6.283185307179586f;
inline constexpr float inverse_sqrt_two = 0.7071067811865476f;
inline constexpr float inverse_sqrt_two_pi = 0.3989422804014327f;

// Round to nearest integer for |x| < 2^22 without a libm call.
inline float round_nearest(float x) {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  return (x + magic) - magic;
}

// e^r for |r| <= ln(2)/2 (a little beyond is fine): Taylor series to degree 7, truncation error
// below 1e-8 relative.
inline float exp_polynomial(float r) {
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

// e^x; inputs below -87 give e^-87 (about 1.6e-38: no subnormals) and above 88 about 2^127.
inline float exp(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  const float n = round_nearest(x * log2_e);
  const float r = (x - n * ln2_high) - n * ln2_low;  // |r| <= ln(2)/2
  const std::int32_t exponent = static_cast<std::int32_t>(n) + 127;
  return exp_polynomial(r) * std::bit_cast<float>(exponent << 23);
}

// Natural logarithm for positive normal floats.
inline float log(float x) {
  const std::int32_t bits = std::bit_cast<std::int32_t>(x);
  // Split x = m * 2^e with m in [sqrt(1/2), sqrt(2)).
  std::int32_t exponent = ((bits >> 23) & 0xff) - 127;
  float mantissa = std::bit_cast<float>((bits & 0x007fffff) | 0x3f800000);
  const bool high = mantissa > 1.41421356f;
  mantissa = high ? mantissa * 0.5f : mantissa;
  exponent = high ? exponent + 1 : exponent;
  // log(m) = 2 atanh(s) with s = (m-1)/(m+1), |s| <= 0.172: odd series to s^11.
  const float s = (mantissa - 1.0f) / (mantissa + 1.0f);
  const float s2 = s * s;
  float p = 2.0f / 11.0f;
  p = p * s2 + 2.0f / 9.0f;
  p = p * s2 + 2.0f / 7.0f;
  p = p * s2 + 2.0f / 5.0f;
  p = p * s2 + 2.0f / 3.0f;
  p = p * s2 + 2.0f;
  const float e = static_cast<float>(exponent);
  return (s * p + e * ln2_low) + e * ln2_high;
}

// cos(2 pi u) and sin(2 pi u) for any u, by quarter-turn reduction.
inline void sincos_turns(float u, float& sine, float& cosine) {
  const float quarter = round_nearest(u * 4.0f);
  const float theta = (u - quarter * 0.25f) * two_pi;  // |theta| <= pi/4
  const float t2 = theta * theta;
  float s = -1.0f / 5040.0f;
  s = s * t2 + 1.0f / 120.0f;
  s = s * t2 - 1.0f / 6.0f;
  s = s * t2 + 1.0f;
  s = s * theta;
  float c = 1.0f / 40320.0f;
  c = c * t2 - 1.0f / 720.0f;
  c = c * t2 + 1.0f / 24.0f;
  c = c * t2 - 0.5f;
  c = c * t2 + 1.0f;
  const std::int32_t turn = static_cast<std::int32_t>(quarter) & 3;
  // Rotate (c, s) by turn quarter turns.
  const float rotated_cos = turn == 0 ? c : turn == 1 ? -s : turn == 2 ? -c : s;
  const float rotated_sin = turn == 0 ? s : turn == 1 ? c : turn == 2 ? -s : -c;
  cosine = rotated_cos;
  sine = rotated_sin;
}

// exp(-x^2 / 2) for |x| <= 16, accurate to a few float ulps however large x^2 / 2 is (0 below
// e^-87: no subnormals). exp turns an absolute error of its argument into a relative error of its
// result (one float ulp of x^2 / 2 at |x| = 4 is 1e-6 of the result), so x^2 is not rounded before
// the argument is reduced: its rounding error is kept by an FMA and added to the reduced argument,
// and -x^2 / 2 - n ln2_high is exact (Sterbenz: the two are within a factor of two wherever
// -x^2 / 2 is large enough for its rounding to matter).
inline float exp_minus_half_square(float x) {
  const float square = x * x;
  const float square_error = std::fma(x, x, -square);
  const float half_square = -0.5f * square;  // exact
  const float n = round_nearest(std::max(half_square, -87.0f) * log2_e);
  const float r = std::fma(-0.5f, square_error, std::fma(-n, ln2_high, half_square)) - n * ln2_low;
  const std::int32_t exponent = static_cast<std::int32_t>(n) + 127;
  const float value = exp_polynomial(r) * std::bit_cast<float>(exponent << 23);
  return half_square < -87.0f ? 0.0f : value;
}

// erfc(z) = t exp(-z^2) Q(t) with t = 1 / (1 + z/2) (Numerical Recipes' erfcc variable), Q a
// polynomial fitted to erfc(z) exp(z^2) / t for t in [0.14, 1] (z up to 12.3; |x| <= 16 keeps
// t >= 0.15): relative error below 5e-8 before its float evaluation. Q in place of erfcc's
// exp(P(t)) saves an exp.
inline float erfc_scaled_factor(float t) {
  float q = -0.059375155717134476f;
  q = q * t + 0.2860688865184784f;
  q = q * t - 0.49029266834259033f;
  q = q * t + 0.28160375356674194f;
  q = q * t - 0.02905982919037342f;
  q = q * t + 0.20371529459953308f;
  q = q * t + 0.24284441769123077f;
  q = q * t + 0.2824108302593231f;
  return q * t + 0.2820844054222107f;
}

// t = 1 / (1 + z/2) for z = a / sqrt(2), a = |x| clamped to 16 by the callers: beyond, the
// Gaussian tail is far below the normal floats anyway, and clamped, x^2 cannot overflow (a huge x
// gave a NaN).
inline float erfc_variable(float magnitude) {
  return 1.0f / std::fma(magnitude, 0.5f * inverse_sqrt_two, 1.0f);
}

// The standard normal CDF Phi(x) = erfc(-x/sqrt(2))/2, exact to float precision in both tails.
inline float normal_cdf(float x) {
  const float a = std::min(std::abs(x), 16.0f);
  const float t = erfc_variable(a);
  const float half_tail = (0.5f * t) * erfc_scaled_factor(t) * exp_minus_half_square(a);
  return x >= 0.0f ? 1.0f - half_tail : half_tail;
}

// Phi(x) + x phi(x), GELU's derivative, with one compensated exp(-x^2/2) for both terms.
inline float normal_cdf_plus_x_pdf(float x) {
  const float a = std::min(std::abs(x), 16.0f);
  const float t = erfc_variable(a);
  const float gaussian = exp_minus_half_square(a);
  const float half_tail = (0.5f * t) * erfc_scaled_factor(t) * gaussian;
  const float cdf = x >= 0.0f ? 1.0f - half_tail : half_tail;
  // Beyond |x| = 16 the density's term is 0 (gaussian is), also for an infinite x.
  return std::abs(x) < 16.0f ? cdf + x * (inverse_sqrt_two_pi * gaussian) : cdf;
}

}  // namespace mlptrain::vector_math
