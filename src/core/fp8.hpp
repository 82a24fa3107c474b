// The two 8-bit float formats of fp8 training (OCP's 8-bit floating point specification, the
// formats of Hopper's tensor cores), written once for the host and a CUDA device:
//   e4m3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities; largest finite 448, smallest
//         normal 2^-6, smallest subnormal 2^-9. The format of weights and activations.
//   e5m2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like; largest finite 57344, smallest
//         normal 2^-14, smallest subnormal 2^-16. The wider range gradients may take.
// Every value of either format is exactly a bfloat16 (and a float) value, so a quantized operand
// is held as bf16 values and multiplied as bf16: the products are exact in fp32 either way.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/precision.hpp"

#if defined(__CUDACC__)
#define MLPTRAIN_FP8_HOST_DEVICE __host__ __device__
#else
#define MLPTRAIN_FP8_HOST_DEVICE
#endif

namespace mlptrain::fp8 {

struct FormatTraits {
  int mantissa_bits;
  int smallest_normal_exponent;  // e_min: 2^e_min is the smallest normal value
  float largest;                 // the largest finite value
};

MLPTRAIN_FP8_HOST_DEVICE constexpr FormatTraits traits(Fp8Format format) {
  return format == Fp8Format::e4m3 ? FormatTraits{3, -6, 448.0f} : FormatTraits{2, -14, 57344.0f};
}

MLPTRAIN_FP8_HOST_DEVICE inline float power_of_two(int exponent) {  // exponent in [-126, 127]
  const std::uint32_t bits = static_cast<std::uint32_t>(exponent + 127) << 23;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

MLPTRAIN_FP8_HOST_DEVICE inline int exponent_of(float value) {  // floor(log2 |value|) for normal floats
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<int>((bits >> 23) & 0xffu) - 127;
}

// x rounded to the nearest value of the format, ties to the even mantissa, then saturated to
// the largest finite value (what a conversion with saturation to finite values gives; x must be
// finite). The quantum at x is 2^(max(e, e_min) - mantissa bits), e = floor(log2 |x|) (a zero
// takes e_min's): dividing by it is exact, so rint's rounding (to nearest, ties to even) is the
// only one. Without branches, so that loops over it vectorize.
MLPTRAIN_FP8_HOST_DEVICE inline float round_to(float x, Fp8Format format) {
  const FormatTraits format_traits = traits(format);
  int exponent = exponent_of(x);
  exponent = exponent < format_traits.smallest_normal_exponent ? format_traits.smallest_normal_exponent : exponent;
  const float rounded = rintf(x * power_of_two(format_traits.mantissa_bits - exponent)) *
                        power_of_two(exponent - format_traits.mantissa_bits);
  const float largest = format_traits.largest;
  return rounded > largest ? largest : rounded < -largest ? -largest : rounded;
}

// The scale an operand with this absolute maximum is multiplied by before rounding: the largest
// power of two that keeps amax x scale within the format's largest value (1 for an operand of
// zeros). A power of two, so that scaling and unscaling are exact and the rounding to the format
// is the only one; it gives up at most one binade of the format's range.
MLPTRAIN_FP8_HOST_DEVICE inline float scale_for(float amax, Fp8Format format) {
  if (!(amax > 0.0f)) return 1.0f;
  const float largest = traits(format).largest;
  int exponent = exponent_of(largest) - exponent_of(amax);
  // largest / amax may be just below that power of two: step down where it overshoots.
  if (amax * power_of_two(exponent) > largest) --exponent;
  if (exponent > 126) exponent = 126;
  if (exponent < -126) exponent = -126;
  return power_of_two(exponent);
}

// The format's byte for a value of it (as round_to gives them): sign, biased exponent (0 for
// zero and the subnormals), mantissa; and the value of a byte. What travels when a tensor moves
// in fp8 (ZeRO-3's gathers), half the bytes of bf16.
MLPTRAIN_FP8_HOST_DEVICE inline std::uint8_t encode(float value, Fp8Format format) {
  const FormatTraits format_traits = traits(format);
  const int bias = 1 - format_traits.smallest_normal_exponent;
  const std::uint32_t sign = value < 0.0f ? 0x80u : 0u;
  const float magnitude = fabsf(value);
  const int exponent = exponent_of(magnitude);
  if (exponent < format_traits.smallest_normal_exponent)  // zero or subnormal: the exponent field 0
    return static_cast<std::uint8_t>(
        sign | static_cast<std::uint32_t>(
                   magnitude * power_of_two(format_traits.mantissa_bits - format_traits.smallest_normal_exponent)));
  const auto mantissa = static_cast<std::uint32_t>(
      (magnitude * power_of_two(-exponent) - 1.0f) * static_cast<float>(1 << format_traits.mantissa_bits));
  return static_cast<std::uint8_t>(
      sign | (static_cast<std::uint32_t>(exponent + bias) << format_traits.mantissa_bits) | mantissa);
}

MLPTRAIN_FP8_HOST_DEVICE inline float decode(std::uint8_t code, Fp8Format format) {
  const FormatTraits format_traits = traits(format);
  const int bias = 1 - format_traits.smallest_normal_exponent;
  const int mantissa_bits = format_traits.mantissa_bits;
  const int exponent = (code & 0x7f) >> mantissa_bits;
  const auto mantissa = static_cast<float>(code & ((1 << mantissa_bits) - 1));
  const float magnitude =
      exponent == 0 ? mantissa * power_of_two(format_traits.smallest_normal_exponent - mantissa_bits)
                    : (1.0f + mantissa * power_of_two(-mantissa_bits)) * power_of_two(exponent - bias);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// encode(round_to(x, format), format) in one pass and without branches, so that a quantizing
// loop vectorizes: with e = max(floor(log2 |x|), e_min) and q = rint(|x| 2^(mantissa bits - e))
// (q counts the format's steps in x's binade, the implicit one included, so a rounding up into
// the next binade lands on that binade's first code), the byte's magnitude is (e - e_min) <<
// mantissa bits, plus q, at most the largest finite value's; a zero is +0's byte whatever x's
// sign, as encode gives it.
MLPTRAIN_FP8_HOST_DEVICE inline std::uint8_t code_of(float x, Fp8Format format) {
  const FormatTraits format_traits = traits(format);
  const float magnitude = fabsf(x);
  int exponent = exponent_of(magnitude);
  exponent = exponent < format_traits.smallest_normal_exponent ? format_traits.smallest_normal_exponent : exponent;
  const auto steps =
      static_cast<std::uint32_t>(rintf(magnitude * power_of_two(format_traits.mantissa_bits - exponent)));
  const std::uint32_t largest_code = format == Fp8Format::e4m3 ? 0x7eu : 0x7bu;
  std::uint32_t code =
      (static_cast<std::uint32_t>(exponent - format_traits.smallest_normal_exponent) << format_traits.mantissa_bits) +
      steps;
  code = code > largest_code ? largest_code : code;
  const std::uint32_t sign = x < 0.0f && code != 0 ? 0x80u : 0u;
  return static_cast<std::uint8_t>(sign | code);
}

}  // namespace mlptrain::fp8
