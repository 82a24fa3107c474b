// Conversions between fp32 and the two 16-bit float formats, element by element: bf16 (fp32's
// exponent, 7 mantissa bits: the upper half of an fp32) and fp16 (IEEE binary16: 5 exponent
// bits, 10 mantissa bits). Rounding is to nearest, ties to even, with subnormals kept (not
// flushed), overflow going to infinity and a NaN staying a (quiet) NaN. Written as integer and
// float arithmetic with selects, so loops over them vectorize (kernels/cpu), and usable from
// any room. A bf16 or fp16 value is held as its bits in a std::uint16_t.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/data_type.hpp"

namespace mlptrain {

inline std::uint16_t round_to_bfloat16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  // Adding 0x7fff plus the lowest kept bit rounds the dropped half to nearest even; a carry
  // out of the mantissa raises the exponent (to infinity from the largest finite values).
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // A NaN keeps its sign and upper payload, with the quiet bit set so it cannot become inf.
  const std::uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline std::uint16_t round_to_float16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  // At or beyond 2^16 the result is infinity (or NaN, quiet).
  const std::uint32_t special = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Below 2^-14 the result is subnormal: adding 2^-1 aligns the 10 kept bits at the bottom of
  // the mantissa, and the float addition itself rounds to nearest even.
  // (The constants are float literals: a bit_cast of a constant keeps GCC from vectorizing.)
  constexpr std::uint32_t subnormal_magic = 126u << 23;  // the bits of 0.5f
  const float aligned = std::bit_cast<float>(magnitude) + 0.5f;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(aligned) - subnormal_magic;
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  const std::uint32_t normal = (magnitude + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd) >> 13;
  const std::uint32_t result = magnitude >= (143u << 23)  ? special
                               : magnitude < (113u << 23) ? subnormal
                                                          : normal;
  return static_cast<std::uint16_t>(result | sign);
}

inline float float16_to_float(std::uint16_t bits) {
  // The exponent and mantissa moved into fp32's places and the exponent rebiased by 127 - 15.
  const std::uint32_t shifted = static_cast<std::uint32_t>(bits & 0x7fffu) << 13;
  const std::uint32_t exponent = shifted & (0x7c00u << 13);
  const std::uint32_t normal = shifted + (112u << 23);
  // Infinity and NaN take fp32's widest exponent; a subnormal m x 2^-24 is renormalized by
  // giving it the smallest normal exponent and subtracting that exponent's implicit one.
  const std::uint32_t special = normal + (112u << 23);
  const float subnormal = std::bit_cast<float>(normal + (1u << 23)) - 6.103515625e-05f;  // 2^-14: 113u << 23
  const std::uint32_t magnitude = exponent == (0x7c00u << 13) ? special
                                  : exponent == 0             ? std::bit_cast<std::uint32_t>(subnormal)
                                                              : normal;
  return std::bit_cast<float>(magnitude | (static_cast<std::uint32_t>(bits & 0x8000u) << 16));
}

// Element `index` of an fp32, bf16 or fp16 array, widened; and stored, rounded. One element at a
// time, for the host's bookkeeping (initialization, checkpoints); kernels convert whole arrays.
inline float load_element(const void* data, std::size_t index, DataType type) {
  if (type == DataType::float32) return static_cast<const float*>(data)[index];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(data)[index];
  return type == DataType::bfloat16 ? bfloat16_to_float(bits) : float16_to_float(bits);
}

inline void store_element(void* data, std::size_t index, DataType type, float value) {
  if (type == DataType::float32) {
    static_cast<float*>(data)[index] = value;
    return;
  }
  static_cast<std::uint16_t*>(data)[index] =
      type == DataType::bfloat16 ? round_to_bfloat16(value) : round_to_float16(value);
}

}  // namespace mlptrain
