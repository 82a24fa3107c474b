// The arithmetic of the counter-based streams, written once for the host and a CUDA device:
// Philox4x32-10's words for an index (Random123's), and the uniform, normal and bounded integer
// values drawn from them, with the float functions they need. Built-in data generated on a GPU is
// the CPU's bit for bit because every rounding here is spelled out: a product that is added is
// fused by an explicit FMA and no other is, and the code that calls these is compiled without
// contraction on both sides (-ffp-contract=off for the host rooms that include this header,
// -fmad=false for the device's generator; see meson.build).
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MLPTRAIN_HOST_DEVICE __host__ __device__
#else
#define MLPTRAIN_HOST_DEVICE
#endif

namespace mlptrain::counter_stream {

// A stream's 64-bit key as Philox takes it.
struct Key {
  std::uint32_t low = 0;
  std::uint32_t high = 0;
};

// The first two of the four words Philox4x32-10 gives for the counter (index, 0, 0, 0).
struct Words {
  std::uint32_t first;
  std::uint32_t second;
};

MLPTRAIN_HOST_DEVICE inline Words words(Key key, std::uint64_t index) {
  const philox4x32_ctr_t counter = {{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), 0, 0}};
  const philox4x32_key_t philox_key = {{key.low, key.high}};
  const philox4x32_ctr_t result = philox4x32(counter, philox_key);
  return {result.v[0], result.v[1]};
}

MLPTRAIN_HOST_DEVICE inline float fused(float a, float b, float c) { return fmaf(a, b, c); }

MLPTRAIN_HOST_DEVICE inline std::int32_t bits_of(float value) {
  std::int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
MLPTRAIN_HOST_DEVICE inline float float_of(std::int32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Round to the nearest integer for |x| < 2^22.
MLPTRAIN_HOST_DEVICE inline float round_nearest(float x) {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23
  return (x + magic) - magic;
}

// 24 random bits mapped to the open interval (0, 1).
MLPTRAIN_HOST_DEVICE inline float open_unit(std::uint32_t word) {
  return (static_cast<float>(word >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// The natural logarithm of a positive normal float: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log(m) = 2 atanh(s) with s = (m-1)/(m+1), |s| <= 0.172, as its odd series to s^11.
MLPTRAIN_HOST_DEVICE inline float log(float x) {
  constexpr float ln2_high = 0.693145751953125f;  // exact in float, so e * ln2_high is exact
  constexpr float ln2_low = 1.428606765330187e-06f;
  const std::int32_t bits = bits_of(x);
  std::int32_t exponent = ((bits >> 23) & 0xff) - 127;
  float mantissa = float_of((bits & 0x007fffff) | 0x3f800000);
  const bool high = mantissa > 1.41421356f;
  mantissa = high ? mantissa * 0.5f : mantissa;
  exponent = high ? exponent + 1 : exponent;
  const float s = (mantissa - 1.0f) / (mantissa + 1.0f);
  const float s2 = s * s;
  float p = 2.0f / 11.0f;
  p = fused(p, s2, 2.0f / 9.0f);
  p = fused(p, s2, 2.0f / 7.0f);
  p = fused(p, s2, 2.0f / 5.0f);
  p = fused(p, s2, 2.0f / 3.0f);
  p = fused(p, s2, 2.0f);
  const float e = static_cast<float>(exponent);
  return fused(e, ln2_high, fused(s, p, e * ln2_low));
}

// cos(2 pi u) and sin(2 pi u) for any u, by quarter-turn reduction (|theta| <= pi/4) and Taylor
// polynomials to theta^7 and theta^8.
MLPTRAIN_HOST_DEVICE inline void sincos_turns(float u, float& sine, float& cosine) {
  constexpr float two_pi = 6.283185307179586f;
  const float quarter = round_nearest(u * 4.0f);
  const float theta = (u - quarter * 0.25f) * two_pi;
  const float t2 = theta * theta;
  float s = -1.0f / 5040.0f;
  s = fused(s, t2, 1.0f / 120.0f);
  s = fused(s, t2, -1.0f / 6.0f);
  s = fused(s, t2, 1.0f);
  s = s * theta;
  float c = 1.0f / 40320.0f;
  c = fused(c, t2, -1.0f / 720.0f);
  c = fused(c, t2, 1.0f / 24.0f);
  c = fused(c, t2, -0.5f);
  c = fused(c, t2, 1.0f);
  const std::int32_t turn = static_cast<std::int32_t>(quarter) & 3;
  cosine = turn == 0 ? c : turn == 1 ? -s : turn == 2 ? -c : s;
  sine = turn == 0 ? s : turn == 1 ? c : turn == 2 ? -s : -c;
}

// e^x for x in [-87, 88] (clamped there): x = n ln2 + r, e^r by its Taylor series to degree 7.
MLPTRAIN_HOST_DEVICE inline float exp(float x) {
  constexpr float ln2_high = 0.693145751953125f;
  constexpr float ln2_low = 1.428606765330187e-06f;
  constexpr float log2_e = 1.4426950408889634f;
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  const float n = round_nearest(x * log2_e);
  const float r = fused(-n, ln2_low, fused(-n, ln2_high, x));
  float p = 1.0f / 5040.0f;
  p = fused(p, r, 1.0f / 720.0f);
  p = fused(p, r, 1.0f / 120.0f);
  p = fused(p, r, 1.0f / 24.0f);
  p = fused(p, r, 1.0f / 6.0f);
  p = fused(p, r, 0.5f);
  p = fused(p, r, 1.0f);
  p = fused(p, r, 1.0f);
  return p * float_of((static_cast<std::int32_t>(n) + 127) << 23);
}

// tanh(x): near 0 its odd Taylor series to x^19 (below 1e-9 relative truncation for |x| < 0.55),
// beyond it 1 - 2 / (e^{2|x|} + 1) with the sign of x (1 in float beyond |x| = 9.1).
MLPTRAIN_HOST_DEVICE inline float tanh(float x) {
  const float magnitude = x < 0.0f ? -x : x;
  if (magnitude < 0.55f) {
    const float x2 = x * x;
    float p = -0.00023912911424355248f;
    p = fused(p, x2, 0.000590027440945586f);
    p = fused(p, x2, -0.0014558343870513183f);
    p = fused(p, x2, 0.003592128036572481f);
    p = fused(p, x2, -0.008863235529902197f);
    p = fused(p, x2, 0.021869488536155203f);
    p = fused(p, x2, -0.05396825396825397f);
    p = fused(p, x2, 0.13333333333333333f);
    p = fused(p, x2, -0.3333333333333333f);
    return fused(x * x2, p, x);
  }
  const float clamped = magnitude < 10.0f ? magnitude : 10.0f;
  const float value = 1.0f - 2.0f / (exp(2.0f * clamped) + 1.0f);
  return x < 0.0f ? -value : value;
}

// A standard normal value: Box-Muller's cosine branch on the two words.
MLPTRAIN_HOST_DEVICE inline float normal(Words words) {
  float sine, cosine;
  sincos_turns(open_unit(words.second), sine, cosine);
  return sqrtf(-2.0f * log(open_unit(words.first))) * cosine;
}

// An integer in [0, bound) from the two words as one 64-bit number, by multiply-shift (the bias is
// below 2^-64 bound, negligible for any dataset).
MLPTRAIN_HOST_DEVICE inline std::uint64_t below(Words words, std::uint64_t bound) {
  const std::uint64_t word = (static_cast<std::uint64_t>(words.second) << 32) | words.first;
#if defined(__CUDA_ARCH__)
  return __umul64hi(word, bound);
#else
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(word) * bound) >> 64);
#endif
}

}  // namespace mlptrain::counter_stream
