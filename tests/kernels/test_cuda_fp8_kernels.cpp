// The CUDA backend's fp8 ops against the CPU's exact emulation on the same operands: amax, inverse
// scales and codes bit for bit (one rounding function, core/fp8.hpp, on both sides), in every
// scaling and layout, across the transposing tiles; ZeRO-3's encoded and decoded weights bit for
// bit; and the fp8 GEMM, on the tensor cores where cuBLASLt takes the shape and through the
// emulation where it does not (10 columns, as a classifier has), within the accumulation's
// rounding of the CPU's fp32 sums: the emulation's fp32, the tensor cores' narrower accumulator.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/fp8.hpp"
#include "tests/kernels/cuda_test_support.hpp"

using namespace mlptrain;
using namespace mlptrain::test;

namespace {

// A bf16 operand [rows, cols] with magnitudes over several binades and an outlying row and column.
std::vector<std::uint8_t> operand(Kernels& cpu, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::vector<float> values = random_values(static_cast<std::size_t>(rows * cols), seed, -1.0f, 1.0f);
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    values[i] = std::ldexp(values[i], static_cast<int>(i % 9) - 4);
    if (i / cols == 3 || i % cols == 5) values[i] *= 300;
  }
  return typed(cpu, values, DataType::bfloat16);
}

TEST_F(CudaKernelsTest, Fp8AmaxScalesAndCodesAreTheCpusBitForBit) {
  const std::int64_t rows = 70, cols = 131;  // tiles of 32 and 64, partly filled
  const std::vector<std::uint8_t> data = operand(*cpu, rows, cols, 21);
  DeviceArray<std::uint8_t> device_data(data);
  for (Fp8Scaling scaling : {Fp8Scaling::tensor, Fp8Scaling::rows, Fp8Scaling::columns})
    for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (Fp8CodeLayout layout : {Fp8CodeLayout::as_is, Fp8CodeLayout::transposed}) {
        const auto count = static_cast<std::size_t>(fp8_scale_count(scaling, rows, cols));
        std::vector<float> amax(count), inverse(count);
        std::vector<std::uint8_t> codes(data.size() / 2);
        cpu->absolute_max(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data());
        cpu->quantize_fp8(data.data(), DataType::bfloat16, rows, cols, scaling, amax.data(), format, layout,
                          codes.data(), inverse.data());
        DeviceArray<float> device_amax{std::vector<float>(count, -1.0f)}, device_inverse{inverse};
        DeviceArray<std::uint8_t> device_codes{std::vector<std::uint8_t>(codes.size(), 0)};
        gpu->absolute_max(device_data.get(), DataType::bfloat16, rows, cols, scaling, device_amax.get());
        ASSERT_EQ(device_amax.host(), amax);
        gpu->quantize_fp8(device_data.get(), DataType::bfloat16, rows, cols, scaling, device_amax.get(), format, layout,
                          device_codes.get(), device_inverse.get());
        ASSERT_EQ(device_inverse.host(), inverse);
        ASSERT_EQ(device_codes.host(), codes);
      }
}

TEST_F(CudaKernelsTest, Fp8EncodedAndDecodedWeightsAreTheCpus) {
  const std::int64_t count = 5000;
  const std::vector<std::uint8_t> data = operand(*cpu, 1, count, 22);
  float amax = 0;
  cpu->absolute_max(data.data(), DataType::bfloat16, 1, count, Fp8Scaling::tensor, &amax);
  std::vector<std::uint8_t> codes(count), values(data.size());
  cpu->encode_fp8(data.data(), DataType::bfloat16, count, &amax, Fp8Format::e4m3, codes.data());
  cpu->decode_fp8(codes.data(), count, &amax, Fp8Format::e4m3, values.data(), DataType::bfloat16);
  DeviceArray<std::uint8_t> device_data{data}, device_codes{std::vector<std::uint8_t>(count)},
      device_values{std::vector<std::uint8_t>(data.size())};
  DeviceArray<float> device_amax{std::vector<float>{amax}};
  gpu->encode_fp8(device_data.get(), DataType::bfloat16, count, device_amax.get(), Fp8Format::e4m3, device_codes.get());
  ASSERT_EQ(device_codes.host(), codes);
  gpu->decode_fp8(device_codes.get(), count, device_amax.get(), Fp8Format::e4m3, device_values.get(),
                  DataType::bfloat16);
  ASSERT_EQ(device_values.host(), values);
}

// One GEMM shape on both backends, forward-like (bf16 out with a bias) and weight-gradient-like
// (fp32 added to what is there). Both sum the same exact products; the CPU (and the GPU's
// emulation) in fp32, which may differ by 2^-12 of the sum of the products' magnitudes (the
// products' sums in another order, with a bit to spare). Hopper's fp8 tensor cores sum in an
// accumulator of about 14 bits (DeepSeek-V3 technical report, section 3.3.2), which cuBLASLt moves
// into fp32 every 128 terms unless fast accumulation is asked for, when it never does. So each of
// an MMA's 32 products is cut below 2^-13 of its group's largest (at most 32 x 2^-13 of the
// magnitude over all groups), and the running sum below 2^-13 of itself once per group of 32
// between promotions: (32 + groups) x 2^-13 of the magnitude. Measured on an H200: 2^-9.5 at
// k = 64, 2^-9.8 at 1,024, and with fast accumulation 2^-7.6 at 4,096, each inside its bound by
// 2^1.6 or more. Either way a bf16 output may differ by one unit in its last place where the two
// sums straddle a rounding boundary. A lost scale, a transposed operand or the other format land
// far outside.
enum class Summation { fp32, tensor_cores };

double summation_bound(Summation summation, std::int64_t k, bool fast_accumulation) {
  if (summation == Summation::fp32) return std::ldexp(1.0, -12);
  const std::int64_t between_promotions = fast_accumulation ? k : std::min<std::int64_t>(k, 128);
  return static_cast<double>(32 + (between_promotions + 31) / 32) * std::ldexp(1.0, -13);
}

void expect_fp8_gemm_matches(Kernels& cpu, Kernels& gpu, std::int64_t m, std::int64_t n, std::int64_t k,
                             Fp8Recipe recipe, Fp8Format a_format, bool fast_accumulation, Summation summation) {
  const double bound = summation_bound(summation, k, fast_accumulation);
  const Fp8Scaling scaling = recipe == Fp8Recipe::tensorwise ? Fp8Scaling::tensor : Fp8Scaling::rows;
  const auto quantized = [&](std::int64_t rows, std::uint64_t seed, Fp8Format format) {
    const std::vector<std::uint8_t> data = operand(cpu, rows, k, seed);
    std::vector<float> amax(static_cast<std::size_t>(fp8_scale_count(scaling, rows, k))), inverse(amax.size());
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * k));
    cpu.absolute_max(data.data(), DataType::bfloat16, rows, k, scaling, amax.data());
    cpu.quantize_fp8(data.data(), DataType::bfloat16, rows, k, scaling, amax.data(), format, Fp8CodeLayout::as_is,
                     codes.data(), inverse.data());
    return std::pair{codes, inverse};
  };
  const auto [a, a_inverse] = quantized(m, 31, a_format);
  const auto [b, b_inverse] = quantized(n, 32, Fp8Format::e4m3);
  const std::vector<std::uint8_t> bias = typed(cpu, random_values(static_cast<std::size_t>(n), 33), DataType::bfloat16);
  std::vector<std::uint8_t> pre(static_cast<std::size_t>(m * n) * 2);
  std::vector<float> grads = random_values(static_cast<std::size_t>(m * n), 34);
  DeviceArray<std::uint8_t> da(a), db(b), dbias(bias), dpre(pre);
  DeviceArray<float> da_inverse(a_inverse), db_inverse(b_inverse), dgrads(grads);
  std::vector<std::byte> workspace(cpu.fp8_gemm_workspace_bytes(m, n, k));
  Fp8Gemm call{.m = m,
               .n = n,
               .k = k,
               .a = a.data(),
               .a_format = a_format,
               .a_inverse = a_inverse.data(),
               .a_scales = scaling,
               .b = b.data(),
               .b_format = Fp8Format::e4m3,
               .b_inverse = b_inverse.data(),
               .b_scales = scaling,
               .bias = bias.data(),
               .c = pre.data(),
               .c_type = DataType::bfloat16,
               .fast_accumulation = fast_accumulation,
               .workspace = workspace.data()};
  cpu.fp8_gemm(call);
  Fp8Gemm on_gpu = call;
  on_gpu.a = da.get();
  on_gpu.a_inverse = da_inverse.get();
  on_gpu.b = db.get();
  on_gpu.b_inverse = db_inverse.get();
  on_gpu.bias = dbias.get();
  on_gpu.c = dpre.get();
  on_gpu.workspace = nullptr;
  ASSERT_EQ(gpu.fp8_gemm_workspace_bytes(m, n, k), 0u);
  gpu.fp8_gemm(on_gpu);
  const std::vector<float> cpu_grads_before = grads;
  call.bias = on_gpu.bias = nullptr;
  call.c = grads.data();
  on_gpu.c = dgrads.get();
  call.c_type = on_gpu.c_type = DataType::float32;
  call.accumulate = on_gpu.accumulate = true;
  cpu.fp8_gemm(call);
  gpu.fp8_gemm(on_gpu);
  const std::vector<float> cpu_pre = widened(cpu, pre, DataType::bfloat16),
                           gpu_pre = widened(cpu, dpre.host(), DataType::bfloat16);
  const std::vector<float> gpu_grads = dgrads.host();
  // The largest differences in units of the products' magnitudes, and the elements outside the bound.
  double worst_pre = 0, worst_grad = 0;
  std::int64_t outside = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double magnitude = 0;
      for (std::int64_t p = 0; p < k; ++p)
        magnitude += std::fabs(static_cast<double>(fp8::decode(a[i * k + p], a_format)) *
                               fp8::decode(b[j * k + p], Fp8Format::e4m3));
      magnitude *= static_cast<double>(a_inverse[scaling == Fp8Scaling::tensor ? 0 : i]) *
                   b_inverse[scaling == Fp8Scaling::tensor ? 0 : j];
      const std::int64_t at = i * n + j;
      const double pre_difference = std::fabs(static_cast<double>(gpu_pre[at]) - cpu_pre[at]);
      const double grad_difference = std::fabs(static_cast<double>(gpu_grads[at]) - grads[at]);
      outside += pre_difference > bound * magnitude + std::ldexp(std::fabs(cpu_pre[at]), -7);
      outside += grad_difference > bound * magnitude + std::ldexp(std::fabs(grads[at]), -23);
      if (magnitude > 0) {
        worst_pre = std::max(worst_pre, std::max(0.0, pre_difference - std::ldexp(std::fabs(cpu_pre[at]), -7)) / magnitude);
        worst_grad = std::max(worst_grad, grad_difference / magnitude);
      }
    }
  std::printf(
      "fp8 GEMM %lld x %lld x %lld, %s, %s%s: largest difference from the CPU's fp32 sums 2^%.1f of the "
      "products' magnitudes (bf16 output beyond its rounding: 2^%.1f); bound 2^%.1f, %lld of %lld outside\n",
      static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
      recipe == Fp8Recipe::tensorwise ? "tensorwise" : "rowwise", a_format == Fp8Format::e4m3 ? "e4m3" : "e5m2",
      fast_accumulation ? ", fast accumulation" : "", std::log2(worst_grad), std::log2(worst_pre), std::log2(bound),
      static_cast<long long>(outside), static_cast<long long>(2 * m * n));
  EXPECT_EQ(outside, 0);
}

TEST_F(CudaKernelsTest, Fp8GemmOnTensorCoresMatchesTheEmulation) {
  for (Fp8Recipe recipe : {Fp8Recipe::tensorwise, Fp8Recipe::rowwise})
    for (Fp8Format a_format : {Fp8Format::e4m3, Fp8Format::e5m2})
      expect_fp8_gemm_matches(*cpu, *gpu, 128, 256, 1024, recipe, a_format, false, Summation::tensor_cores);
  expect_fp8_gemm_matches(*cpu, *gpu, 128, 256, 64, Fp8Recipe::tensorwise, Fp8Format::e4m3, false,
                          Summation::tensor_cores);
}

TEST_F(CudaKernelsTest, Fp8GemmWithFastAccumulationStaysNearTheEmulation) {
  expect_fp8_gemm_matches(*cpu, *gpu, 128, 256, 4096, Fp8Recipe::tensorwise, Fp8Format::e4m3, true,
                          Summation::tensor_cores);
}

// Shapes cuBLASLt's fp8 matmul does not take (10 columns, k of 40: leading dimensions that are not
// multiples of 16 bytes) go through the backend's emulation.
TEST_F(CudaKernelsTest, Fp8GemmOfOddShapesMatchesTheEmulation) {
  for (Fp8Recipe recipe : {Fp8Recipe::tensorwise, Fp8Recipe::rowwise}) {
    expect_fp8_gemm_matches(*cpu, *gpu, 33, 10, 40, recipe, Fp8Format::e4m3, false, Summation::fp32);
    expect_fp8_gemm_matches(*cpu, *gpu, 64, 10, 256, recipe, Fp8Format::e5m2, false, Summation::fp32);
  }
}

}  // namespace

// The fused passes against the GPU's own separate ones, bit for bit: GELU forward and backward
// and the loss gradient's rounding taking the amax of what they write (packed and unpacked
// shapes), and one operand coded for two
// products in one pass (tensorwise and rowwise pairs; the tensorwise as_is codes in packs too),
// whose codes are also the CPU's.
TEST_F(CudaKernelsTest, Fp8FusedPassesEqualTheSeparateOnes) {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{70, 131}, {64, 128}};
  for (const auto& [rows, cols] : shapes) {
    const std::int64_t count = rows * cols;
    const std::vector<std::uint8_t> pre = operand(*cpu, rows, cols, 23);
    const std::vector<std::uint8_t> upstream = operand(*cpu, rows, cols, 24);
    DeviceArray<std::uint8_t> device_pre(pre), device_upstream(upstream);
    DeviceArray<std::uint8_t> fused(std::vector<std::uint8_t>(pre.size())), plain(std::vector<std::uint8_t>(pre.size()));
    DeviceArray<float> amax{std::vector<float>{-1.0f}}, expected{std::vector<float>{-2.0f}};
    gpu->gelu_forward_amax(device_pre.get(), fused.get(), rows, cols, DataType::bfloat16, amax.get());
    gpu->gelu_forward(device_pre.get(), plain.get(), rows, cols, DataType::bfloat16);
    gpu->absolute_max(plain.get(), DataType::bfloat16, rows, cols, Fp8Scaling::tensor, expected.get());
    ASSERT_EQ(fused.host(), plain.host());
    ASSERT_EQ(amax.host(), expected.host());
    DeviceArray<float> fused_sums{std::vector<float>(cols, 0.0f)}, plain_sums{std::vector<float>(cols, 0.0f)};
    gpu->gelu_backward_amax(device_upstream.get(), device_pre.get(), fused.get(), DataType::bfloat16, fused_sums.get(),
                            DataType::float32, false, rows, cols, amax.get());
    gpu->gelu_backward(device_upstream.get(), device_pre.get(), plain.get(), DataType::bfloat16, plain_sums.get(),
                       DataType::float32, false, rows, cols);
    gpu->absolute_max(plain.get(), DataType::bfloat16, rows, cols, Fp8Scaling::tensor, expected.get());
    ASSERT_EQ(fused.host(), plain.host());
    ASSERT_EQ(fused_sums.host(), plain_sums.host());
    ASSERT_EQ(amax.host(), expected.host());
    DeviceArray<float> widened(random_values(static_cast<std::size_t>(count), 25, -40.0f, 40.0f));
    gpu->convert_amax(widened.get(), DataType::float32, fused.get(), DataType::bfloat16, count, amax.get());
    gpu->convert(widened.get(), DataType::float32, plain.get(), DataType::bfloat16, count);
    gpu->absolute_max(plain.get(), DataType::bfloat16, 1, count, Fp8Scaling::tensor, expected.get());
    ASSERT_EQ(fused.host(), plain.host());
    ASSERT_EQ(amax.host(), expected.host());

    const std::pair<Fp8Scaling, Fp8Scaling> scalings[] = {{Fp8Scaling::tensor, Fp8Scaling::tensor},
                                                          {Fp8Scaling::rows, Fp8Scaling::columns}};
    for (const auto& [first, second] : scalings) {
      const auto first_count = static_cast<std::size_t>(fp8_scale_count(first, rows, cols));
      const auto second_count = static_cast<std::size_t>(fp8_scale_count(second, rows, cols));
      std::vector<float> first_amax(first_count), second_amax(second_count);
      cpu->absolute_max(pre.data(), DataType::bfloat16, rows, cols, first, first_amax.data());
      cpu->absolute_max(pre.data(), DataType::bfloat16, rows, cols, second, second_amax.data());
      std::vector<std::uint8_t> cpu_first(count), cpu_second(count);
      std::vector<float> cpu_first_inverse(first_count), cpu_second_inverse(second_count);
      cpu->quantize_fp8(pre.data(), DataType::bfloat16, rows, cols, first, first_amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::as_is, cpu_first.data(), cpu_first_inverse.data());
      cpu->quantize_fp8(pre.data(), DataType::bfloat16, rows, cols, second, second_amax.data(), Fp8Format::e4m3,
                        Fp8CodeLayout::transposed, cpu_second.data(), cpu_second_inverse.data());
      DeviceArray<float> device_first_amax(first_amax), device_second_amax(second_amax);
      DeviceArray<std::uint8_t> first_codes{std::vector<std::uint8_t>(count)}, second_codes{std::vector<std::uint8_t>(count)};
      DeviceArray<float> first_inverse{std::vector<float>(first_count)}, second_inverse{std::vector<float>(second_count)};
      gpu->quantize_fp8_pair(device_pre.get(), DataType::bfloat16, rows, cols, Fp8Format::e4m3,
                             {first, device_first_amax.get(), first_codes.get(), first_inverse.get()},
                             {second, device_second_amax.get(), second_codes.get(), second_inverse.get()},
                             Fp8CodeLayout::transposed);
      ASSERT_EQ(first_codes.host(), cpu_first);
      ASSERT_EQ(second_codes.host(), cpu_second);
      ASSERT_EQ(first_inverse.host(), cpu_first_inverse);
      ASSERT_EQ(second_inverse.host(), cpu_second_inverse);
      // The single cast's packed tensorwise path too.
      gpu->quantize_fp8(device_pre.get(), DataType::bfloat16, rows, cols, first, device_first_amax.get(),
                        Fp8Format::e4m3, Fp8CodeLayout::as_is, first_codes.get(), first_inverse.get());
      ASSERT_EQ(first_codes.host(), cpu_first);
    }
  }
}
