// MoE's row moves on the CPU: dispatch's gather and combine's per-token sums, each row's inner
// loop a function of its own over restrict pointers (as gelu_rows.hpp's, so GCC vectorizes the
// 16-bit types' conversions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/elements.hpp"

namespace mlptrain {

template <typename E>
[[gnu::noinline]] void scaled_copy_row(const typename E::Storage* __restrict in, float factor,
                                       typename E::Storage* __restrict out, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) out[col] = E::store(factor * E::load(in[col]));
}

template <typename E>
[[gnu::noinline]] void set_scaled_row(const typename E::Storage* __restrict in, float factor,
                                      float* __restrict sum, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) sum[col] = factor * E::load(in[col]);
}

template <typename E>
[[gnu::noinline]] void add_scaled_row(const typename E::Storage* __restrict in, float factor,
                                      float* __restrict sum, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) sum[col] = std::fma(factor, E::load(in[col]), sum[col]);
}

template <typename E>
[[gnu::noinline]] void store_row(const float* __restrict sum, typename E::Storage* __restrict out, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) out[col] = E::store(sum[col]);
}

// destination[i, :] = scales[i] * source[indices[i], :].
template <typename E>
void gather_rows_of(const void* source, const std::int32_t* indices, const float* scales, void* destination,
                    std::int64_t rows, std::int64_t cols) {
  for (std::int64_t row = 0; row < rows; ++row)
    scaled_copy_row<E>(elements<E>(source) + static_cast<std::int64_t>(indices[row]) * cols,
                       scales != nullptr ? scales[row] : 1.0f, elements<E>(destination) + row * cols, cols);
}

// Each token's row of `destination` written once: its rows' scaled sum in fp32 in list order,
// begun with the first row's term (no pass of zeros first; a token without rows gets zeros), each
// further term added by an FMA (so on every backend alike), then rounded to D (in a row of scratch
// unless D is fp32).
template <typename S, typename D>
void sum_token_rows_of(const void* source, const std::int32_t* row_begin, const std::int32_t* rows,
                       const float* scales, void* destination, std::int64_t tokens, std::int64_t cols) {
  std::vector<float> scratch(std::is_same_v<D, Fp32> ? 0 : static_cast<std::size_t>(cols));
  for (std::int64_t token = 0; token < tokens; ++token) {
    auto* out = elements<D>(destination) + token * cols;
    float* sum;
    if constexpr (std::is_same_v<D, Fp32>) {
      sum = out;
    } else {
      sum = scratch.data();
    }
    if (row_begin[token] == row_begin[token + 1]) std::fill(sum, sum + cols, 0.0f);
    for (std::int32_t entry = row_begin[token]; entry < row_begin[token + 1]; ++entry) {
      const std::int64_t row = rows[entry];
      const auto* in = elements<S>(source) + row * cols;
      const float factor = scales != nullptr ? scales[row] : 1.0f;
      if (entry == row_begin[token]) {
        set_scaled_row<S>(in, factor, sum, cols);
      } else {
        add_scaled_row<S>(in, factor, sum, cols);
      }
    }
    if constexpr (!std::is_same_v<D, Fp32>) store_row<D>(sum, out, cols);
  }
}

}  // namespace mlptrain
