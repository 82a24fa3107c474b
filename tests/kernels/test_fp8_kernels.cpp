// The CPU's fp8 kernels against naive loops written from Kernels' contract: the amax of each
// scale's elements (one for all, one per row, one per column), the operand scaled by the power of
// two of core/fp8.hpp, rounded and coded (its rounding is tested against the formats' tables in
// tests/core/test_fp8.cpp), as it is or transposed, and the GEMM of codes unscaled with the bias
// or the gradient already there added in fp32 and rounded once. The fused passes (GELU forward
// and backward and the rounding of the loss's gradient taking the amax of what they write; one
// operand coded for two products in one pass) equal the separate passes bit for bit, on the CPU
// and on the loopback device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/fp8.hpp"
#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"
#include "kernels/loopback/loopback_backend.hpp"

using namespace mlptrain;

namespace {

constexpr std::int64_t rows = 5, cols = 7;

// bf16 values with magnitudes spread over six binades, and a row and a column far above the rest.
std::vector<std::uint16_t> operand() {
  std::vector<float> values(rows * cols);
  CounterRng(3, "fp8-kernels").fill_uniform(values.data(), 0, values.size(), -1.0f, 1.0f);
  std::vector<std::uint16_t> bits(values.size());
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    float value = std::ldexp(values[i], static_cast<int>(i % 6) - 3);
    if (i / cols == 2 || i % cols == 4) value *= 1000;
    store_element(bits.data(), i, DataType::bfloat16, value);
  }
  return bits;
}

std::int64_t scale_of(Fp8Scaling scaling, std::int64_t row, std::int64_t col) {
  return scaling == Fp8Scaling::tensor ? 0 : scaling == Fp8Scaling::rows ? row : col;
}

}  // namespace

TEST(Fp8Kernels, AmaxAndCodesFollowEachScalesElements) {
  const auto kernels = make_cpu_kernels();
  const std::vector<std::uint16_t> data = operand();
  for (Fp8Scaling scaling : {Fp8Scaling::tensor, Fp8Scaling::rows, Fp8Scaling::columns})
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const std::int64_t count = fp8_scale_count(scaling, rows, cols);
      std::vector<float> expected_amax(count, 0.0f), amax(count, -1.0f), inverse(count);
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        float& into = expected_amax[scale_of(scaling, i / cols, i % cols)];
        into = std::max(into, std::fabs(load_element(data.data(), i, DataType::bfloat16)));
      }
      kernels->absolute_max(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data());
      ASSERT_EQ(amax, expected_amax);
      for (Fp8CodeLayout layout : {Fp8CodeLayout::as_is, Fp8CodeLayout::transposed}) {
        std::vector<std::uint8_t> codes(data.size());
        kernels->quantize_fp8(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data(), format, layout,
                              codes.data(), inverse.data());
        for (std::int64_t i = 0; i < rows * cols; ++i) {
          const std::int64_t row = i / cols, col = i % cols, scale_at = scale_of(scaling, row, col);
          const float scale = fp8::scale_for(expected_amax[scale_at], format);
          ASSERT_EQ(inverse[scale_at] * scale, 1.0f);
          const float expected = fp8::round_to(load_element(data.data(), i, DataType::bfloat16) * scale, format);
          const std::int64_t at = layout == Fp8CodeLayout::as_is ? i : col * rows + row;
          ASSERT_EQ(fp8::decode(codes[at], format), expected) << i;
          // The largest element of each scale lands in the top half of the format's range.
          if (std::fabs(load_element(data.data(), i, DataType::bfloat16)) == expected_amax[scale_at]) {
            ASSERT_GE(std::fabs(expected) * 2, fp8::traits(format).largest);
          }
        }
      }
    }
}

// Across the transposing pass's tiles (64 x 64): every code lands at its transposed place.
TEST(Fp8Kernels, TransposedCodesCrossTiles) {
  const auto kernels = make_cpu_kernels();
  constexpr std::int64_t tall = 70, wide = 131;
  std::vector<float> values(tall * wide);
  CounterRng(9, "fp8-tiles").fill_uniform(values.data(), 0, values.size(), -4.0f, 4.0f);
  std::vector<std::uint16_t> data(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) store_element(data.data(), i, DataType::bfloat16, values[i]);
  std::vector<float> amax(wide), inverse(wide);
  kernels->absolute_max(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data());
  std::vector<std::uint8_t> as_is(data.size()), transposed(data.size());
  kernels->quantize_fp8(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::as_is, as_is.data(), inverse.data());
  kernels->quantize_fp8(data.data(), DataType::bfloat16, tall, wide, Fp8Scaling::columns, amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::transposed, transposed.data(), inverse.data());
  for (std::int64_t row = 0; row < tall; ++row)
    for (std::int64_t col = 0; col < wide; ++col) ASSERT_EQ(transposed[col * tall + row], as_is[row * wide + col]);
}

// The fp8 GEMM against a sum in double of the codes' decoded products, unscaled, with the bias or
// the gradient already there added, rounded once: within the fp32 sum's rounding (k terms, each
// step off by at most 2^-24 of the running magnitude) and one unit of the output's last place
// (where that sum's error crosses a rounding boundary). A scale applied twice, a transposed
// operand read as it is, or e5m2 codes read as e4m3 miss it by far.
TEST(Fp8Kernels, GemmOfCodesIsTheirUnscaledProductRoundedOnce) {
  const auto kernels = make_cpu_kernels();
  constexpr std::int64_t m = 6, n = 9, k = 40;
  const auto random_codes = [](std::size_t count, std::uint64_t seed) {
    std::vector<float> uniform(count);
    CounterRng(seed, "fp8-gemm-codes").fill_uniform(uniform.data(), 0, count, 0.0f, 256.0f);
    std::vector<std::uint8_t> codes(count);
    for (std::size_t i = 0; i < count; ++i) codes[i] = static_cast<std::uint8_t>(std::min(255.0f, uniform[i]));
    return codes;
  };
  std::vector<std::uint8_t> a = random_codes(m * k, 11), b = random_codes(n * k, 12);
  // No NaN codes (e4m3's S.1111.111); e5m2's infinities and NaNs are never produced either.
  for (auto& code : a)
    if ((code & 0x7f) == 0x7f) code ^= 1;
  for (auto& code : b)
    if ((code & 0x7c) == 0x7c) code &= 0xbb;
  std::vector<float> a_inverse(m), b_inverse(n);
  for (std::int64_t i = 0; i < m; ++i) a_inverse[i] = std::ldexp(1.0f, static_cast<int>(i) - 8);
  for (std::int64_t j = 0; j < n; ++j) b_inverse[j] = std::ldexp(1.0f, 2 - static_cast<int>(j));
  std::vector<std::uint16_t> bias(n);
  for (std::int64_t j = 0; j < n; ++j) store_element(bias.data(), j, DataType::bfloat16, 0.37f * static_cast<float>(j));
  // The same codes stored transposed ([k, m], [k, n]), as a backend that reads them through its
  // GEMM's strides takes them.
  std::vector<std::uint8_t> a_transposed(a.size()), b_transposed(b.size());
  for (std::int64_t p = 0; p < k; ++p) {
    for (std::int64_t i = 0; i < m; ++i) a_transposed[p * m + i] = a[i * k + p];
    for (std::int64_t j = 0; j < n; ++j) b_transposed[p * n + j] = b[j * k + p];
  }
  for (int variant = 0; variant < 4; ++variant) {
    const bool per_row = variant % 2 == 1, stored_transposed = variant >= 2;
    const Fp8Scaling scales = per_row ? Fp8Scaling::rows : Fp8Scaling::tensor;
    const Transpose stored = stored_transposed ? Transpose::yes : Transpose::no;
    std::vector<std::uint16_t> pre(m * n);
    std::vector<float> grads(m * n, 0.75f);
    std::vector<std::byte> workspace(kernels->fp8_gemm_workspace_bytes(m, n, k));
    Fp8Gemm call{.m = m,
                 .n = n,
                 .k = k,
                 .transpose_a = stored,
                 .transpose_b = stored,
                 .a = stored_transposed ? a_transposed.data() : a.data(),
                 .a_format = Fp8Format::e4m3,
                 .a_inverse = a_inverse.data(),
                 .a_scales = scales,
                 .b = stored_transposed ? b_transposed.data() : b.data(),
                 .b_format = Fp8Format::e5m2,
                 .b_inverse = b_inverse.data(),
                 .b_scales = scales,
                 .bias = bias.data(),
                 .c = pre.data(),
                 .c_type = DataType::bfloat16,
                 .workspace = workspace.data()};
    kernels->fp8_gemm(call);
    call.bias = nullptr;
    call.c = grads.data();
    call.c_type = DataType::float32;
    call.accumulate = true;
    kernels->fp8_gemm(call);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double product = static_cast<double>(fp8::decode(a[i * k + p], Fp8Format::e4m3)) *
                                 fp8::decode(b[j * k + p], Fp8Format::e5m2);
          sum += product;
          magnitude += std::fabs(product);
        }
        const double factor = static_cast<double>(a_inverse[per_row ? i : 0]) * b_inverse[per_row ? j : 0];
        const double accumulation = k * std::ldexp(magnitude, -24) * factor;
        const double with_bias = sum * factor + load_element(bias.data(), j, DataType::bfloat16);
        const double got = load_element(pre.data(), i * n + j, DataType::bfloat16);
        ASSERT_LE(std::fabs(got - with_bias), accumulation + std::ldexp(std::fabs(with_bias), -7)) << i << "," << j;
        const double added = sum * factor + 0.75;
        ASSERT_LE(std::fabs(grads[i * n + j] - added), accumulation + std::ldexp(std::fabs(added), -23))
            << i << "," << j;
      }
  }
}

namespace {

// A backend and host arrays moved to and from its memory (the loopback device's is not the
// host's: its pointers only reach the host through the allocator's copies).
struct Backend {
  Backend(const char* name, bool loopback)
      : name(name),
        kernels(loopback ? make_loopback_kernels() : make_cpu_kernels()),
        memory(loopback ? make_loopback_allocator(ledger) : std::make_unique<HostAllocator>(ledger)) {}

  const char* name;
  std::unique_ptr<Kernels> kernels;
  MemoryLedger ledger;
  std::unique_ptr<Allocator> memory;

  template <typename T>
  Buffer upload(const std::vector<T>& values) {
    Buffer buffer = memory->allocate(MemoryState::workspace, values.size() * sizeof(T));
    memory->copy_to_device(buffer.as<void>(), values.data(), values.size() * sizeof(T));
    return buffer;
  }
  template <typename T>
  std::vector<T> download(const Buffer& buffer, std::size_t count) {
    std::vector<T> values(count);
    memory->copy_to_host(values.data(), buffer.as<void>(), count * sizeof(T));
    return values;
  }
};

std::vector<std::unique_ptr<Backend>> backends() {
  std::vector<std::unique_ptr<Backend>> made;
  made.push_back(std::make_unique<Backend>("cpu", false));
  made.push_back(std::make_unique<Backend>("loopback", true));
  return made;
}

// `count` values of `type` over several binades, one far above the rest at `outlier`.
std::vector<std::uint8_t> spread_values(std::int64_t count, DataType type, std::uint64_t seed, std::int64_t outlier) {
  std::vector<float> values(static_cast<std::size_t>(count));
  CounterRng(seed, "fp8-fused").fill_uniform(values.data(), 0, values.size(), -3.0f, 3.0f);
  std::vector<std::uint8_t> stored(static_cast<std::size_t>(count) * size_of(type));
  for (std::int64_t i = 0; i < count; ++i)
    store_element(stored.data(), i, type, std::ldexp(values[i], static_cast<int>(i % 5) - 2) * (i == outlier ? 40.0f : 1.0f));
  return stored;
}

}  // namespace

// GELU forward and backward, and the loss gradient's rounding: rows crossing the CPU's blocks of
// 16 and tiles of 64, the largest magnitude in the last block.
TEST(Fp8Kernels, KernelsThatMakeAnOperandTakeItsAmaxAsAPassOverItWould) {
  constexpr std::int64_t gelu_rows = 70, gelu_cols = 33;
  constexpr std::int64_t count = gelu_rows * gelu_cols;
  for (auto& backend : backends())
    for (DataType type : {DataType::float32, DataType::bfloat16}) {
      SCOPED_TRACE(std::string(backend->name) + " " + std::string(data_type_name(type)));
      Kernels& kernels = *backend->kernels;
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(type);
      Buffer pre = backend->upload(spread_values(count, type, 1, count - 3));
      Buffer upstream = backend->upload(spread_values(count, type, 2, count - 40));
      Buffer fused_out = backend->memory->allocate(MemoryState::workspace, bytes);
      Buffer plain_out = backend->memory->allocate(MemoryState::workspace, bytes);
      Buffer amax = backend->upload(std::vector<float>{-1.0f}), expected = backend->upload(std::vector<float>{-2.0f});
      kernels.gelu_forward_amax(pre.as<void>(), fused_out.as<void>(), gelu_rows, gelu_cols, type, amax.floats());
      kernels.gelu_forward(pre.as<void>(), plain_out.as<void>(), gelu_rows, gelu_cols, type);
      kernels.absolute_max(plain_out.as<void>(), type, gelu_rows, gelu_cols, Fp8Scaling::tensor, expected.floats());
      EXPECT_EQ(backend->download<std::uint8_t>(fused_out, bytes), backend->download<std::uint8_t>(plain_out, bytes));
      EXPECT_EQ(backend->download<float>(amax, 1), backend->download<float>(expected, 1));
      EXPECT_GT(backend->download<float>(amax, 1)[0], 0.0f);
      // Backward: d(pre) and the bias sums as gelu_backward's, and the amax of d(pre).
      Buffer fused_sums = backend->upload(std::vector<float>(gelu_cols, 0.5f));
      Buffer plain_sums = backend->upload(std::vector<float>(gelu_cols, 0.5f));
      kernels.gelu_backward_amax(upstream.as<void>(), pre.as<void>(), fused_out.as<void>(), type, fused_sums.as<void>(),
                                 DataType::float32, true, gelu_rows, gelu_cols, amax.floats());
      kernels.gelu_backward(upstream.as<void>(), pre.as<void>(), plain_out.as<void>(), type, plain_sums.as<void>(),
                            DataType::float32, true, gelu_rows, gelu_cols);
      kernels.absolute_max(plain_out.as<void>(), type, gelu_rows, gelu_cols, Fp8Scaling::tensor, expected.floats());
      EXPECT_EQ(backend->download<std::uint8_t>(fused_out, bytes), backend->download<std::uint8_t>(plain_out, bytes));
      EXPECT_EQ(backend->download<float>(fused_sums, gelu_cols), backend->download<float>(plain_sums, gelu_cols));
      EXPECT_EQ(backend->download<float>(amax, 1), backend->download<float>(expected, 1));
      // The loss's gradient rounded from fp32 (blocks of 16384 on the CPU: a long one crosses them).
      if (type == DataType::float32) continue;
      constexpr std::int64_t long_count = 40000;
      Buffer widened = backend->upload(spread_values(long_count, DataType::float32, 4, long_count - 7));
      Buffer fused_rounded = backend->memory->allocate_elements(MemoryState::workspace, long_count, type);
      Buffer plain_rounded = backend->memory->allocate_elements(MemoryState::workspace, long_count, type);
      kernels.convert_amax(widened.as<void>(), DataType::float32, fused_rounded.as<void>(), type, long_count,
                           amax.floats());
      kernels.convert(widened.as<void>(), DataType::float32, plain_rounded.as<void>(), type, long_count);
      kernels.absolute_max(plain_rounded.as<void>(), type, 1, long_count, Fp8Scaling::tensor, expected.floats());
      const std::size_t rounded_bytes = long_count * size_of(type);
      EXPECT_EQ(backend->download<std::uint8_t>(fused_rounded, rounded_bytes),
                backend->download<std::uint8_t>(plain_rounded, rounded_bytes));
      EXPECT_EQ(backend->download<float>(amax, 1), backend->download<float>(expected, 1));
    }
}

// Both codings of a pair, in both layouts of the rows-summed one and every pair of scalings a
// product pair uses, equal quantize_fp8's two passes; the transposed codes cross tiles of 64.
TEST(Fp8Kernels, OneOperandCodedForTwoProductsEqualsTwoSeparateCasts) {
  constexpr std::int64_t pair_rows = 70, pair_cols = 131;
  constexpr std::int64_t count = pair_rows * pair_cols;
  for (auto& backend : backends()) {
    Kernels& kernels = *backend->kernels;
    Buffer data = backend->upload(spread_values(count, DataType::bfloat16, 3, 5 * pair_cols + 9));
    const std::pair<Fp8Scaling, Fp8Scaling> scalings[] = {{Fp8Scaling::tensor, Fp8Scaling::tensor},
                                                          {Fp8Scaling::rows, Fp8Scaling::columns}};
    for (const auto& [first_scaling, second_scaling] : scalings)
      for (Fp8CodeLayout layout : {Fp8CodeLayout::as_is, Fp8CodeLayout::transposed}) {
        SCOPED_TRACE(std::string(backend->name) + (layout == Fp8CodeLayout::as_is ? " as_is" : " transposed"));
        const std::int64_t first_count = fp8_scale_count(first_scaling, pair_rows, pair_cols);
        const std::int64_t second_count = fp8_scale_count(second_scaling, pair_rows, pair_cols);
        Buffer first_amax = backend->upload(std::vector<float>(first_count));
        Buffer second_amax = backend->upload(std::vector<float>(second_count));
        kernels.absolute_max(data.as<void>(), DataType::bfloat16, pair_rows, pair_cols, first_scaling, first_amax.floats());
        kernels.absolute_max(data.as<void>(), DataType::bfloat16, pair_rows, pair_cols, second_scaling,
                             second_amax.floats());
        const auto room = [&](std::int64_t scales) {
          return std::pair{backend->memory->allocate(MemoryState::workspace, static_cast<std::size_t>(count)),
                           backend->upload(std::vector<float>(scales, -1.0f))};
        };
        auto [paired_first, paired_first_inverse] = room(first_count);
        auto [paired_second, paired_second_inverse] = room(second_count);
        auto [single_first, single_first_inverse] = room(first_count);
        auto [single_second, single_second_inverse] = room(second_count);
        kernels.quantize_fp8_pair(
            data.as<void>(), DataType::bfloat16, pair_rows, pair_cols, Fp8Format::e4m3,
            {first_scaling, first_amax.floats(), paired_first.as<std::uint8_t>(), paired_first_inverse.floats()},
            {second_scaling, second_amax.floats(), paired_second.as<std::uint8_t>(), paired_second_inverse.floats()},
            layout);
        kernels.quantize_fp8(data.as<void>(), DataType::bfloat16, pair_rows, pair_cols, first_scaling,
                             first_amax.floats(), Fp8Format::e4m3, Fp8CodeLayout::as_is,
                             single_first.as<std::uint8_t>(), single_first_inverse.floats());
        kernels.quantize_fp8(data.as<void>(), DataType::bfloat16, pair_rows, pair_cols, second_scaling,
                             second_amax.floats(), Fp8Format::e4m3, layout, single_second.as<std::uint8_t>(),
                             single_second_inverse.floats());
        const auto codes = [&](const Buffer& buffer) { return backend->download<std::uint8_t>(buffer, count); };
        EXPECT_EQ(codes(paired_first), codes(single_first));
        EXPECT_EQ(codes(paired_second), codes(single_second));
        EXPECT_EQ(backend->download<float>(paired_first_inverse, first_count),
                  backend->download<float>(single_first_inverse, first_count));
        EXPECT_EQ(backend->download<float>(paired_second_inverse, second_count),
                  backend->download<float>(single_second_inverse, second_count));
        // The two codings differ where their scales do: the test would see a swapped pair.
        if (first_scaling != second_scaling) EXPECT_NE(codes(paired_first), codes(paired_second));
      }
  }
}
