// The element types tensors, kernels and communicators work on, as one closed set. Training
// values are fp32, bf16 or fp16 (DESIGN.md §2.7); the others carry counts, indices and bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mlptrain {

enum class DataType { float32, float64, int32, int64, uint8, bfloat16, float16 };

constexpr std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::float32: return 4;
    case DataType::float64: return 8;
    case DataType::int32: return 4;
    case DataType::int64: return 8;
    case DataType::uint8: return 1;
    case DataType::bfloat16: return 2;
    case DataType::float16: return 2;
  }
  return 0;
}

// The names users write (--param-dtype fp32|bf16|fp16) and reports print.
constexpr std::string_view data_type_name(DataType type) {
  switch (type) {
    case DataType::float32: return "fp32";
    case DataType::float64: return "fp64";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::uint8: return "uint8";
    case DataType::bfloat16: return "bf16";
    case DataType::float16: return "fp16";
  }
  return "?";
}

constexpr bool is_half(DataType type) {
  return type == DataType::bfloat16 || type == DataType::float16;
}

// The element `elements` past `data` (null stays null).
inline void* advance(void* data, std::size_t elements, DataType type) {
  return data == nullptr ? nullptr : static_cast<char*>(data) + elements * size_of(type);
}
inline const void* advance(const void* data, std::size_t elements, DataType type) {
  return data == nullptr ? nullptr : static_cast<const char*>(data) + elements * size_of(type);
}

template <typename T>
constexpr DataType data_type_of();
template <> constexpr DataType data_type_of<float>() { return DataType::float32; }
template <> constexpr DataType data_type_of<double>() { return DataType::float64; }
template <> constexpr DataType data_type_of<std::int32_t>() { return DataType::int32; }
template <> constexpr DataType data_type_of<std::int64_t>() { return DataType::int64; }
template <> constexpr DataType data_type_of<std::uint64_t>() { return DataType::int64; }
template <> constexpr DataType data_type_of<std::uint8_t>() { return DataType::uint8; }
template <> constexpr DataType data_type_of<char>() { return DataType::uint8; }

}  // namespace mlptrain
