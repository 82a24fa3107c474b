// The training element types on the host as traits: how each is stored, widened to fp32 and
// rounded back (half_float.hpp's branch-free conversions, so loops over them still vectorize), and
// one dispatch from a run-time DataType to a body written once for all three (the CPU kernels',
// the shared-memory collectives' sums).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/data_type.hpp"
#include "core/half_float.hpp"

namespace mlptrain {

struct Fp32 {
  using Storage = float;
  static float load(float value) { return value; }
  static float store(float value) { return value; }
};

struct Bf16 {
  using Storage = std::uint16_t;
  static float load(std::uint16_t bits) { return bfloat16_to_float(bits); }
  static std::uint16_t store(float value) { return round_to_bfloat16(value); }
};

struct Fp16 {
  using Storage = std::uint16_t;
  static float load(std::uint16_t bits) { return float16_to_float(bits); }
  static std::uint16_t store(float value) { return round_to_float16(value); }
};

// Calls body(Element{}) for the traits of `type` (one of the training types).
template <typename Body>
decltype(auto) with_element(DataType type, Body&& body) {
  switch (type) {
    case DataType::float32: return body(Fp32{});
    case DataType::bfloat16: return body(Bf16{});
    case DataType::float16: return body(Fp16{});
    default:
      throw std::logic_error("computing on fp32, bf16 and fp16 elements, not " + std::string(data_type_name(type)));
  }
}

// The element pointer of `type`'s traits.
template <typename Element>
typename Element::Storage* elements(void* data) {
  return static_cast<typename Element::Storage*>(data);
}
template <typename Element>
const typename Element::Storage* elements(const void* data) {
  return static_cast<const typename Element::Storage*>(data);
}

}  // namespace mlptrain
