// The CPU's fp8 operand kernels (see fp8_kernels.hpp). Each loop runs along a row with whatever
// varies per column held in a row of its own (the column scales, expanded from one where the
// scale is the tensor's), so that it vectorizes; absolute values are compared as their bits,
// which order non-negative floats as their values do, so the maxima vectorize too. Rows are
// spread over the rank's GEMM threads (an element's result depends on nothing else, a maximum
// on no order), which would otherwise wait for these passes.
#include "kernels/cpu/fp8_kernels.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "core/elements.hpp"
#include "core/fp8.hpp"

namespace mlptrain::cpu_fp8 {

namespace {

// Below this many elements a pass stays on one thread.
constexpr std::int64_t threaded_elements = 1 << 16;

// |value|'s bits: for fp32 the low 31, for the 16-bit formats the low 15.
std::uint32_t magnitude_bits(float value) { return std::bit_cast<std::uint32_t>(value) & 0x7fffffffu; }
std::uint32_t magnitude_bits(std::uint16_t value) { return value & 0x7fffu; }
template <typename E>
float from_magnitude_bits(std::uint32_t bits) {
  if constexpr (std::is_same_v<E, Fp32>) return std::bit_cast<float>(bits);
  else return E::load(static_cast<std::uint16_t>(bits));
}

// A row of `cols` per-column values: the given ones, or one repeated.
std::vector<float> per_column(const float* values, Fp8Scaling scaling, std::int64_t cols) {
  return scaling == Fp8Scaling::tensor ? std::vector<float>(static_cast<std::size_t>(cols), values[0])
                                       : std::vector<float>(values, values + cols);
}

// out[i] = the code of in[i] x row_scale x column_scales[i]. Everything it reads is a parameter:
// a byte store may alias anything, so a value read through a reference inside the loop would be
// read again after every store, and the loop would not vectorize.
template <typename E>
void code_span(const typename E::Storage* __restrict in, const float* __restrict column_scales, float row_scale,
               std::int64_t count, Fp8Format format, std::uint8_t* __restrict out) {
  for (std::int64_t i = 0; i < count; ++i)
    out[i] = fp8::code_of(E::load(in[i]) * row_scale * column_scales[i], format);
}

// Where the emulated GEMM's operands and sums lie in its workspace, each 64-byte aligned.
struct EmulationWorkspace {
  std::uint16_t* a;
  std::uint16_t* b;
  float* sums;
};
constexpr std::size_t aligned(std::size_t bytes) { return (bytes + 63) / 64 * 64; }
EmulationWorkspace emulation_workspace(void* memory, std::int64_t m, std::int64_t n, std::int64_t k) {
  auto* bytes = static_cast<std::byte*>(memory);
  const std::size_t a_bytes = aligned(static_cast<std::size_t>(m * k) * 2);
  const std::size_t b_bytes = aligned(static_cast<std::size_t>(n * k) * 2);
  return {reinterpret_cast<std::uint16_t*>(bytes), reinterpret_cast<std::uint16_t*>(bytes + a_bytes),
          reinterpret_cast<float*>(bytes + a_bytes + b_bytes)};
}

// Codes to their values as bf16 (exact), through a table of the format's 256 values.
void decode_values(const std::uint8_t* codes, std::int64_t count, Fp8Format format, std::uint16_t* values) {
  std::uint16_t table[256];
  for (int code = 0; code < 256; ++code)
    table[code] = Bf16::store(fp8::decode(static_cast<std::uint8_t>(code), format));
#pragma omp parallel for schedule(static) if (count >= threaded_elements)
  for (std::int64_t i = 0; i < count; ++i) values[i] = table[codes[i]];
}

// c = accumulator x row_inverse x column_inverse (+ bias) (+ c), in fp32, rounded once.
void unscale_product(const float* accumulator, std::int64_t rows, std::int64_t cols, const float* row_inverse,
                     Fp8Scaling row_scales, const float* column_inverse, Fp8Scaling column_scales, const void* bias,
                     void* c, DataType c_type, bool accumulate) {
  const std::vector<float> column_factors = per_column(column_inverse, column_scales, cols);
  with_element(c_type, [&](auto element) {
    using E = decltype(element);
    auto* out = elements<E>(c);
    // The bias widened once (zeros without one: adding +0 leaves every sum as it is).
    std::vector<float> bias_values(static_cast<std::size_t>(cols), 0.0f);
    if (bias != nullptr)
      for (std::int64_t col = 0; col < cols; ++col) bias_values[col] = E::load(elements<E>(bias)[col]);
#pragma omp parallel for schedule(static) if (rows * cols >= threaded_elements)
    for (std::int64_t row = 0; row < rows; ++row) {
      const float row_factor = row_inverse[row_scales == Fp8Scaling::tensor ? 0 : row];
      const float* in = accumulator + row * cols;
      auto* out_row = out + row * cols;
      if (accumulate) {
        for (std::int64_t col = 0; col < cols; ++col)
          out_row[col] =
              E::store(in[col] * row_factor * column_factors[col] + bias_values[col] + E::load(out_row[col]));
      } else {
        for (std::int64_t col = 0; col < cols; ++col)
          out_row[col] = E::store(in[col] * row_factor * column_factors[col] + bias_values[col]);
      }
    }
  });
}

}  // namespace

void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                  float* amax) {
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* values = elements<E>(data);
    std::vector<std::uint32_t> column_largest(scaling == Fp8Scaling::columns ? static_cast<std::size_t>(cols) : 0, 0);
    if (scaling == Fp8Scaling::columns) {
      for (std::int64_t row = 0; row < rows; ++row)
        for (std::int64_t col = 0; col < cols; ++col)
          column_largest[col] = std::max(column_largest[col], magnitude_bits(values[row * cols + col]));
    }
    std::uint32_t tensor_largest = 0;
#pragma omp parallel for schedule(static) reduction(max : tensor_largest) if (rows * cols >= threaded_elements)
    for (std::int64_t row = 0; row < rows; ++row) {
      if (scaling == Fp8Scaling::columns) continue;
      const auto* in = values + row * cols;
      std::uint32_t largest = 0;
      for (std::int64_t col = 0; col < cols; ++col) largest = std::max(largest, magnitude_bits(in[col]));
      if (scaling == Fp8Scaling::rows) amax[row] = from_magnitude_bits<E>(largest);
      tensor_largest = std::max(tensor_largest, largest);
    }
    if (scaling == Fp8Scaling::tensor) amax[0] = from_magnitude_bits<E>(tensor_largest);
    for (std::size_t col = 0; col < column_largest.size(); ++col) amax[col] = from_magnitude_bits<E>(column_largest[col]);
  });
}

namespace {

// One coding of an operand: each scale and its inverse (written out), the per-column scales a
// row's loop multiplies by (a scale per row multiplies the row instead).
struct Coder {
  Coder(Fp8Scaling scaling, const float* amax, float* inverse_scales, std::int64_t rows, std::int64_t cols,
        Fp8Format format)
      : scaling(scaling), scales(static_cast<std::size_t>(fp8_scale_count(scaling, rows, cols))) {
    for (std::size_t index = 0; index < scales.size(); ++index) {
      scales[index] = fp8::scale_for(amax[index], format);
      inverse_scales[index] = 1.0f / scales[index];
    }
    column_scales = scaling == Fp8Scaling::rows ? std::vector<float>(static_cast<std::size_t>(cols), 1.0f)
                                                : per_column(scales.data(), scaling, cols);
  }
  float row_scale(std::int64_t row) const { return scaling == Fp8Scaling::rows ? scales[row] : 1.0f; }

  Fp8Scaling scaling;
  std::vector<float> scales;
  std::vector<float> column_scales;
};

// Codes of columns [first_col, last_col) of the operand's row `row` into `out`, contiguous.
template <typename E>
void code_row(const typename E::Storage* in, std::int64_t cols, const Coder& coder, std::int64_t row,
              std::int64_t first_col, std::int64_t last_col, Fp8Format format, std::uint8_t* out) {
  code_span<E>(in + row * cols + first_col, coder.column_scales.data() + first_col, coder.row_scale(row),
               last_col - first_col, format, out);
}

// The operand coded by each of `coders` into its codes in its layout, in one pass: a row's codes
// as_is straight out; transposed ones through a tile whose rows are coded along the source's rows,
// then written out by columns.
struct CodedOutput {
  const Coder& coder;
  Fp8CodeLayout layout;
  std::uint8_t* codes;
};
void code_operand(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                  std::initializer_list<CodedOutput> outputs) {
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* in = elements<E>(data);
    constexpr std::int64_t tile = 64;
#pragma omp parallel for schedule(static) if (rows * cols >= threaded_elements)
    for (std::int64_t row_tile = 0; row_tile < rows; row_tile += tile) {
      std::uint8_t block[tile][tile];
      const std::int64_t row_end = std::min(rows, row_tile + tile);
      for (const CodedOutput& output : outputs) {
        if (output.layout == Fp8CodeLayout::as_is) {
          for (std::int64_t row = row_tile; row < row_end; ++row)
            code_row<E>(in, cols, output.coder, row, 0, cols, format, output.codes + row * cols);
          continue;
        }
        for (std::int64_t col_tile = 0; col_tile < cols; col_tile += tile) {
          const std::int64_t col_end = std::min(cols, col_tile + tile);
          for (std::int64_t row = row_tile; row < row_end; ++row)
            code_row<E>(in, cols, output.coder, row, col_tile, col_end, format, block[row - row_tile]);
          for (std::int64_t col = col_tile; col < col_end; ++col)
            for (std::int64_t row = row_tile; row < row_end; ++row)
              output.codes[col * rows + row] = block[row - row_tile][col - col_tile];
        }
      }
    }
  });
}

}  // namespace

void quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
              const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes, float* inverse_scales) {
  const Coder coder(scaling, amax, inverse_scales, rows, cols, format);
  code_operand(data, type, rows, cols, format, {{coder, layout, codes}});
}

void quantize_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                   const Fp8Coding& summed_columns, const Fp8Coding& summed_rows, Fp8CodeLayout summed_rows_layout) {
  const Coder first(summed_columns.scaling, summed_columns.amax, summed_columns.inverse_scales, rows, cols, format);
  const Coder second(summed_rows.scaling, summed_rows.amax, summed_rows.inverse_scales, rows, cols, format);
  code_operand(data, type, rows, cols, format,
               {{first, Fp8CodeLayout::as_is, summed_columns.codes}, {second, summed_rows_layout, summed_rows.codes}});
}

float largest_magnitude(const void* data, DataType type, std::int64_t count) {
  float largest = 0.0f;
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* values = elements<E>(data);
    std::uint32_t bits = 0;
    for (std::int64_t i = 0; i < count; ++i) bits = std::max(bits, magnitude_bits(values[i]));
    largest = from_magnitude_bits<E>(bits);
  });
  return largest;
}

float larger_magnitude(float a, float b) {
  // Non-negative floats (NaN's magnitude above infinity's) order as their bits.
  return std::bit_cast<std::uint32_t>(a) >= std::bit_cast<std::uint32_t>(b) ? a : b;
}

std::size_t gemm_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k) {
  return aligned(static_cast<std::size_t>(m * k) * 2) + aligned(static_cast<std::size_t>(n * k) * 2) +
         static_cast<std::size_t>(m * n) * sizeof(float);
}

void gemm(const Fp8Gemm& call, const std::function<void(const Gemm&)>& bf16_gemm) {
  const EmulationWorkspace workspace = emulation_workspace(call.workspace, call.m, call.n, call.k);
  decode_values(call.a, call.m * call.k, call.a_format, workspace.a);
  decode_values(call.b, call.n * call.k, call.b_format, workspace.b);
  bf16_gemm(fp8_values_product(call, workspace.a, workspace.b, workspace.sums));
  // b's scales are one per row of b: one per column of c.
  unscale_product(workspace.sums, call.m, call.n, call.a_inverse, call.a_scales, call.b_inverse,
                  call.b_scales == Fp8Scaling::tensor ? Fp8Scaling::tensor : Fp8Scaling::columns, call.bias, call.c,
                  call.c_type, call.accumulate);
}

void encode(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
            std::uint8_t* codes) {
  const float scale = fp8::scale_for(*amax, format);
  with_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* in = elements<E>(values);
    for (std::size_t i = 0; i < count; ++i) codes[i] = fp8::code_of(E::load(in[i]) * scale, format);
  });
}

void decode(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
            DataType type) {
  const float inverse = 1.0f / fp8::scale_for(*amax, format);
  with_element(type, [&](auto element) {
    using E = decltype(element);
    auto* out = elements<E>(values);
    for (std::size_t i = 0; i < count; ++i) out[i] = E::store(fp8::decode(codes[i], format) * inverse);
  });
}

}  // namespace mlptrain::cpu_fp8
