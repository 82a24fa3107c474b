// GELU's row kernels on the CPU: fp32 through vector_math's branch-free functions, and the 16-bit
// types through tables of every one of their 65,536 values. A bf16 or fp16 pre-activation can
// only be one of those values, so a table can hold each one's GELU and GELU', at a load per
// element instead of an erfc and an exp (3-4x faster here).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <type_traits>
#include <vector>

#include "core/elements.hpp"
#include "core/vector_math.hpp"

namespace mlptrain {

inline float gelu(float x) { return x * vector_math::normal_cdf(x); }
inline float gelu_derivative(float x) { return vector_math::normal_cdf_plus_x_pdf(x); }

// Row kernels: the inner loops of the row-wise kernels, each a function of its own over restrict
// pointers, kept out of line: inlined into a loop over rows, GCC 12 does not vectorize fp16's
// conversions (a call per row costs nothing beside a row's work).
template <typename E>
using Row = typename E::Storage* __restrict;
template <typename E>
using ConstRow = const typename E::Storage* __restrict;

// GELU of every value of a 16-bit type, indexed by its bits: the rounded output, and the
// derivative in fp32 (the backward multiplies it by the upstream gradient before rounding). The
// outputs are held in 32-bit words: GCC vectorizes those lookups as gathers (1.6x faster).
struct HalfGeluTable {
  std::vector<std::uint32_t> activated;
  std::vector<float> derivative;
};

// Filled from double-precision libm, so each entry is GELU rounded to the type (through fp32)
// all the way down to bf16's subnormals, below the range of the fp32 function's exp.
template <typename E>
HalfGeluTable make_half_gelu_table() {
  static_assert(std::is_same_v<typename E::Storage, std::uint16_t>);
  HalfGeluTable table{std::vector<std::uint32_t>(1u << 16), std::vector<float>(1u << 16)};
  for (std::uint32_t bits = 0; bits < (1u << 16); ++bits) {
    const double x = E::load(static_cast<std::uint16_t>(bits));
    const double cdf = 0.5 * std::erfc(-x * std::numbers::sqrt2 / 2);
    const double pdf = std::exp(-0.5 * x * x) * std::numbers::inv_sqrtpi / std::numbers::sqrt2;
    table.activated[bits] = E::store(static_cast<float>(x * cdf));
    // At the infinities the density's term is 0 (not inf * 0, a NaN).
    table.derivative[bits] = static_cast<float>(cdf + (pdf == 0.0 ? 0.0 : x * pdf));
  }
  return table;
}

// activated = GELU of the pre-activation as stored.
template <typename E>
[[gnu::noinline]] void gelu_row(ConstRow<E> pre, Row<E> activated, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) activated[col] = E::store(gelu(E::load(pre[col])));
}
[[gnu::noinline]] inline void gelu_row(const std::uint16_t* __restrict pre, std::uint16_t* __restrict activated,
                                       const std::uint32_t* __restrict table, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) activated[col] = static_cast<std::uint16_t>(table[pre[col]]);
}

// d(pre) = d(activated) * GELU'(pre), rounded and stored, and added (as stored) to the running
// column sums: the bias gradient sees what the weight gradient's GEMM will read.
template <typename E>
[[gnu::noinline]] void gelu_backward_row(ConstRow<E> upstream, ConstRow<E> pre, Row<E> grad_pre,
                                         float* __restrict running, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) {
    const auto stored = E::store(E::load(upstream[col]) * gelu_derivative(E::load(pre[col])));
    grad_pre[col] = stored;
    running[col] += E::load(stored);
  }
}
template <typename E>
[[gnu::noinline]] void gelu_backward_row(ConstRow<E> upstream, ConstRow<E> pre, Row<E> grad_pre,
                                         float* __restrict running, const float* __restrict derivative,
                                         std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) {
    const auto stored = E::store(E::load(upstream[col]) * derivative[pre[col]]);
    grad_pre[col] = stored;
    running[col] += E::load(stored);
  }
}

}  // namespace mlptrain
