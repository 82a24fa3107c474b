// The CUDA kernels against the CPU backend on the same random inputs (the built-in samples bit for
// bit), the biased GEMM's epilogue against a case where rounding twice shows, and the device
// allocator against the ledger. Without a GPU the binary says why and exits 77, which Meson
// counts as a skip.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "core/half_float.hpp"
#include "core/rng.hpp"
#include "data/dataset.hpp"
#include "kernels/cuda/biased_matmul.hpp"
#include "kernels/cuda/cuda_backend.hpp"

using namespace mlptrain;

namespace {

std::vector<float> random_values(std::size_t count, std::uint64_t seed, float low = -2.0f, float high = 2.0f) {
  std::vector<float> values(count);
  CounterRng(seed, "cuda-kernel-test").fill_uniform(values.data(), 0, count, low, high);
  return values;
}

// A device copy of a host vector, read back on demand.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(1, size_) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return data_; }
  std::vector<T> host() const {
    std::vector<T> values(size_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Every element within `tolerance` of the CPU's, relative to the largest CPU magnitude.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance = 1e-5) {
  ASSERT_EQ(gpu.size(), cpu.size());
  double scale = 1e-30;
  for (float value : cpu) scale = std::max(scale, static_cast<double>(std::fabs(value)));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(gpu[i]) - cpu[i]), tolerance * scale) << "element " << i;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Kernels> cpu = make_cpu_kernels();
  std::unique_ptr<Kernels> gpu = make_cuda_kernels(0);
};

TEST_F(CudaKernelsTest, GemmInEveryTransposition) {
  const std::int64_t m = 37, n = 29, k = 53;
  for (Transpose ta : {Transpose::no, Transpose::yes})
    for (Transpose tb : {Transpose::no, Transpose::yes}) {
      const std::int64_t lda = ta == Transpose::no ? k : m, ldb = tb == Transpose::no ? n : k;
      const auto a = random_values(static_cast<std::size_t>(m * k), 1), b = random_values(static_cast<std::size_t>(k * n), 2);
      auto c = random_values(static_cast<std::size_t>(m * n), 3);
      DeviceArray<float> da(a), db(b), dc(c);
      cpu->gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), n);
      gpu->gemm(ta, tb, m, n, k, 0.5f, da.get(), lda, db.get(), ldb, 0.25f, dc.get(), n);
      expect_close(dc.host(), c);
    }
}

// A biased GEMM, fp32 and bf16 (the fp32 sums plus the bias, rounded once): the GPU's bf16
// results within one bf16 step of the CPU's (the order of the fp32 sums differs).
TEST_F(CudaKernelsTest, GemmWithBias) {
  const std::int64_t m = 31, n = 45, k = 57;
  const auto a = random_values(static_cast<std::size_t>(m * k), 11), b = random_values(static_cast<std::size_t>(n * k), 12);
  const auto bias = random_values(static_cast<std::size_t>(n), 13);
  for (DataType type : {DataType::float32, DataType::bfloat16}) {
    const std::size_t width = size_of(type);
    std::vector<std::uint8_t> ha(a.size() * width), hb(b.size() * width), hbias(bias.size() * width),
        hc(static_cast<std::size_t>(m * n) * width);
    cpu->convert(a.data(), DataType::float32, ha.data(), type, a.size());
    cpu->convert(b.data(), DataType::float32, hb.data(), type, b.size());
    cpu->convert(bias.data(), DataType::float32, hbias.data(), type, bias.size());
    DeviceArray<std::uint8_t> da(ha), db(hb), dbias(hbias), dc(hc);
    const auto biased = [&](const void* x, const void* w, const void* add, void* c) {
      return Gemm{.transpose_b = Transpose::yes, .m = m, .n = n, .k = k, .a = x, .lda = k, .b = w, .ldb = k, .c = c,
                  .ldc = n, .input = type, .output = type, .bias = add};
    };
    cpu->gemm(biased(ha.data(), hb.data(), hbias.data(), hc.data()));
    gpu->gemm(biased(da.get(), db.get(), dbias.get(), dc.get()));
    std::vector<float> cpu_c(static_cast<std::size_t>(m * n)), gpu_c(cpu_c.size());
    cpu->convert(hc.data(), type, cpu_c.data(), DataType::float32, cpu_c.size());
    cpu->convert(dc.host().data(), type, gpu_c.data(), DataType::float32, gpu_c.size());
    expect_close(gpu_c, cpu_c, type == DataType::float32 ? 1e-5 : 1.0 / 128);
  }
}

TEST_F(CudaKernelsTest, GeluForwardAndBackwardAndColumnSums) {
  const std::int64_t rows = 33, cols = 70;
  const auto size = static_cast<std::size_t>(rows * cols);
  auto pre = random_values(size, 4), activated = std::vector<float>(size), bias = random_values(cols, 5);
  DeviceArray<float> dpre(pre), dactivated(activated), dbias(bias);
  cpu->gelu_forward(pre.data(), activated.data(), rows, cols);
  gpu->gelu_forward(dpre.get(), dactivated.get(), rows, cols);
  expect_close(dactivated.host(), activated);
  for (bool accumulate : {false, true}) {
    const auto upstream = random_values(size, 6);
    auto grad_pre = std::vector<float>(size), bias_grad = random_values(cols, 7);
    DeviceArray<float> dupstream(upstream), dgrad_pre(grad_pre), dbias_grad(bias_grad);
    cpu->gelu_backward(upstream.data(), pre.data(), grad_pre.data(), bias_grad.data(), accumulate, rows, cols);
    gpu->gelu_backward(dupstream.get(), dpre.get(), dgrad_pre.get(), dbias_grad.get(), accumulate, rows, cols);
    expect_close(dgrad_pre.host(), grad_pre);
    expect_close(dbias_grad.host(), bias_grad);
  }
  auto data = random_values(size, 8);
  DeviceArray<float> ddata(data);
  cpu->bias_add(data.data(), bias.data(), rows, cols);
  gpu->bias_add(ddata.get(), dbias.get(), rows, cols);
  expect_close(ddata.host(), data);
}

TEST_F(CudaKernelsTest, Losses) {
  const std::int64_t rows = 300, cols = 10;
  const auto size = static_cast<std::size_t>(rows * cols);
  const auto prediction = random_values(size, 9), target = random_values(size, 10);
  std::vector<float> grad(size);
  DeviceArray<float> dprediction(prediction), dtarget(target), dgrad(grad);
  const double cpu_sum = cpu->mse(prediction.data(), target.data(), grad.data(), rows, cols, 0.25f);
  const double gpu_sum = gpu->mse(dprediction.get(), dtarget.get(), dgrad.get(), rows, cols, 0.25f);
  EXPECT_NEAR(gpu_sum, cpu_sum, 1e-9 * cpu_sum);
  expect_close(dgrad.host(), grad);
  EXPECT_NEAR(gpu->mse(dprediction.get(), dtarget.get(), nullptr, rows, cols, 1.0f), cpu_sum, 1e-9 * cpu_sum);

  std::vector<std::int32_t> labels(rows);
  for (std::int64_t row = 0; row < rows; ++row) labels[row] = static_cast<std::int32_t>((row * 7) % cols);
  DeviceArray<std::int32_t> dlabels(labels);
  const CrossEntropyResult cpu_result = cpu->cross_entropy(prediction.data(), labels.data(), grad.data(), rows, cols, 0.5f);
  const CrossEntropyResult gpu_result = gpu->cross_entropy(dprediction.get(), dlabels.get(), dgrad.get(), rows, cols, 0.5f);
  EXPECT_NEAR(gpu_result.loss_sum, cpu_result.loss_sum, 1e-9 * cpu_result.loss_sum);
  EXPECT_EQ(gpu_result.correct, cpu_result.correct);
  expect_close(dgrad.host(), grad);
}

TEST_F(CudaKernelsTest, SoftmaxAndItsBackward) {
  const std::int64_t rows = 65, cols = 8;
  const auto size = static_cast<std::size_t>(rows * cols);
  auto probabilities = random_values(size, 11, -6.0f, 6.0f);
  DeviceArray<float> dprobabilities(probabilities);
  cpu->softmax_rows(probabilities.data(), rows, cols);
  gpu->softmax_rows(dprobabilities.get(), rows, cols);
  expect_close(dprobabilities.host(), probabilities);
  auto grad = random_values(size, 12);
  DeviceArray<float> dgrad(grad);
  cpu->softmax_backward_rows(probabilities.data(), grad.data(), grad.data(), rows, cols);  // aliased
  gpu->softmax_backward_rows(dprobabilities.get(), dgrad.get(), dgrad.get(), rows, cols);
  expect_close(dgrad.host(), grad);
}

TEST_F(CudaKernelsTest, RowMovesOfMixtureOfExperts) {
  const std::int64_t rows = 40, cols = 96, sources = 13;
  const auto source = random_values(static_cast<std::size_t>(sources * cols), 13);
  const auto scales = random_values(rows, 14);
  std::vector<std::int32_t> indices(rows);
  for (std::int64_t row = 0; row < rows; ++row) indices[row] = static_cast<std::int32_t>((row * 5) % sources);  // repeats
  DeviceArray<float> dsource(source), dscales(scales);
  DeviceArray<std::int32_t> dindices(indices);
  for (bool scaled : {false, true}) {
    std::vector<float> gathered(static_cast<std::size_t>(rows * cols));
    DeviceArray<float> dgathered(gathered);
    cpu->gather_rows(source.data(), indices.data(), scaled ? scales.data() : nullptr, gathered.data(), rows, cols);
    gpu->gather_rows(dsource.get(), dindices.get(), scaled ? dscales.get() : nullptr, dgathered.get(), rows, cols);
    expect_close(dgathered.host(), gathered);
    // Back to the sources: each one's gathered rows, listed (source 0 takes rows 0, 13, 26, 39).
    std::vector<std::int32_t> row_begin(sources + 1, 0), listed;
    for (std::int64_t target = 0; target < sources; ++target) {
      for (std::int64_t row = 0; row < rows; ++row)
        if (indices[row] == target) listed.push_back(static_cast<std::int32_t>(row));
      row_begin[target + 1] = static_cast<std::int32_t>(listed.size());
    }
    DeviceArray<std::int32_t> drow_begin(row_begin), dlisted(listed);
    auto destination = random_values(static_cast<std::size_t>(sources * cols), 15);
    DeviceArray<float> ddestination(destination);
    cpu->sum_token_rows(gathered.data(), row_begin.data(), listed.data(), scaled ? scales.data() : nullptr,
                        destination.data(), sources, cols);
    gpu->sum_token_rows(dgathered.get(), drow_begin.get(), dlisted.get(), scaled ? dscales.get() : nullptr,
                        ddestination.get(), sources, cols);
    expect_close(ddestination.host(), destination);
  }
  const auto other = random_values(static_cast<std::size_t>(rows * cols), 16);
  std::vector<float> dots(rows);
  DeviceArray<float> dother(other), ddots(dots);
  cpu->row_dots(source.data(), indices.data(), other.data(), dots.data(), rows, cols);
  gpu->row_dots(dsource.get(), dindices.get(), dother.get(), ddots.get(), rows, cols);
  expect_close(ddots.host(), dots);
}

TEST_F(CudaKernelsTest, AdamWAndFlatOps) {
  const std::size_t count = 100003;  // not a multiple of any block size
  auto params = random_values(count, 17), exp_avg = random_values(count, 18, -0.1f, 0.1f),
       exp_avg_sq = random_values(count, 19, 0.0f, 0.01f);
  const auto grads = random_values(count, 20);
  DeviceArray<float> dparams(params), dexp_avg(exp_avg), dexp_avg_sq(exp_avg_sq), dgrads(grads);
  const AdamWStep step{.learning_rate = 1e-2, .weight_decay = 0.1, .step = 3};
  const double cpu_norm = cpu->adamw(params.data(), grads.data(), exp_avg.data(), exp_avg_sq.data(), count, step);
  const double gpu_norm = gpu->adamw(dparams.get(), dgrads.get(), dexp_avg.get(), dexp_avg_sq.get(), count, step);
  EXPECT_NEAR(gpu_norm, cpu_norm, 1e-9 * cpu_norm);
  expect_close(dparams.host(), params);
  expect_close(dexp_avg.host(), exp_avg);
  expect_close(dexp_avg_sq.host(), exp_avg_sq);

  EXPECT_NEAR(gpu->sum_of_squares(dgrads.get(), count), cpu->sum_of_squares(grads.data(), count), 1e-9 * cpu_norm);
  auto data = random_values(count, 21);
  DeviceArray<float> ddata(data);
  cpu->scale(data.data(), count, 0.75f);
  gpu->scale(ddata.get(), count, 0.75f);
  cpu->add(data.data(), grads.data(), count);
  gpu->add(ddata.get(), dgrads.get(), count);
  expect_close(ddata.host(), data);
  gpu->copy(ddata.get(), dgrads.get(), count);
  expect_close(ddata.host(), grads, 0.0);
  gpu->fill(ddata.get(), count, 2.5f);
  expect_close(ddata.host(), std::vector<float>(count, 2.5f), 0.0);
}

// Half-typed copies of fp32 values (the CPU's conversion), as bytes.
std::vector<std::uint8_t> typed(Kernels& cpu, const std::vector<float>& values, DataType type) {
  std::vector<std::uint8_t> bytes(values.size() * size_of(type));
  cpu.convert(values.data(), DataType::float32, bytes.data(), type, values.size());
  return bytes;
}
std::vector<float> widened(Kernels& cpu, const std::vector<std::uint8_t>& bytes, DataType type) {
  std::vector<float> values(bytes.size() / size_of(type));
  cpu.convert(bytes.data(), type, values.data(), DataType::float32, values.size());
  return values;
}

// The epilogue adds the bias to the fp32 sum before the one rounding: every product here is 257
// (257 ones times ones, exact in fp32 whatever the order), the bias 0.5. Rounded once, 257.5 is
// 258 in bf16; rounded twice (257 to 256, then 256.5 to 256) it would be 256. The rows are
// padded to 16 bytes so that cuBLASLt's epilogue takes it (asserted); the kernels' call with the
// bias one element off its alignment takes the other path and must give the same.
TEST_F(CudaKernelsTest, BiasedGemmRoundsOnceAfterAddingTheBias) {
  const std::int64_t m = 64, n = 96, k = 257, leading = 264;
  const DataType type = DataType::bfloat16;
  const auto ones = [&](std::int64_t rows) {  // [rows, k] ones, rows padded with zeros
    std::vector<float> values(static_cast<std::size_t>(rows * leading), 0.0f);
    for (std::int64_t row = 0; row < rows; ++row)
      std::fill_n(values.begin() + row * leading, k, 1.0f);
    return typed(*cpu, values, type);
  };
  DeviceArray<std::uint8_t> da(ones(m)), db(ones(n));
  DeviceArray<std::uint8_t> dbias(typed(*cpu, std::vector<float>(static_cast<std::size_t>(n + 8), 0.5f), type));
  const auto gemm = [&](void* c, std::int64_t bias_offset) {
    return Gemm{.transpose_b = Transpose::yes, .m = m, .n = n, .k = k, .a = da.get(), .lda = leading, .b = db.get(),
                .ldb = leading, .c = c, .ldc = n, .input = type, .output = type,
                .bias = dbias.get() + bias_offset * static_cast<std::int64_t>(size_of(type))};
  };
  const std::vector<float> once(static_cast<std::size_t>(m * n), 258.0f);
  {
    BiasedMatmul epilogue(nullptr, false);
    DeviceArray<std::uint8_t> dc(std::vector<std::uint8_t>(static_cast<std::size_t>(m * n) * size_of(type)));
    ASSERT_TRUE(epilogue.run(gemm(dc.get(), 0))) << "cuBLASLt offered no algorithm with the bias epilogue";
    EXPECT_EQ(widened(*cpu, dc.host(), type), once);
  }
  for (std::int64_t bias_offset : {0, 1}) {
    DeviceArray<std::uint8_t> dc(std::vector<std::uint8_t>(static_cast<std::size_t>(m * n) * size_of(type)));
    gpu->gemm(gemm(dc.get(), bias_offset));
    EXPECT_EQ(widened(*cpu, dc.host(), type), once) << "bias offset " << bias_offset;
  }
}

// The epilogue's GEMM in every transposition against the CPU's, with a random bias (one a
// column of the output: a bias along the other axis would show), bf16 and fp32.
TEST_F(CudaKernelsTest, BiasedGemmThroughTheEpilogueInEveryTransposition) {
  const std::int64_t m = 40, n = 56, k = 72;  // multiples of 8: every row 16-byte aligned
  for (DataType type : {DataType::float32, DataType::bfloat16})
    for (Transpose ta : {Transpose::no, Transpose::yes})
      for (Transpose tb : {Transpose::no, Transpose::yes}) {
        const std::int64_t lda = ta == Transpose::no ? k : m, ldb = tb == Transpose::no ? n : k;
        const auto a = typed(*cpu, random_values(static_cast<std::size_t>(m * k), 50), type);
        const auto b = typed(*cpu, random_values(static_cast<std::size_t>(k * n), 51), type);
        const auto bias = typed(*cpu, random_values(static_cast<std::size_t>(n), 52), type);
        std::vector<std::uint8_t> c(static_cast<std::size_t>(m * n) * size_of(type));
        DeviceArray<std::uint8_t> da(a), db(b), dbias(bias), dc(c);
        const auto gemm = [&](const void* x, const void* y, const void* z, void* out) {
          return Gemm{.transpose_a = ta, .transpose_b = tb, .m = m, .n = n, .k = k, .a = x, .lda = lda, .b = y, .ldb = ldb,
                      .c = out, .ldc = n, .input = type, .output = type, .bias = z};
        };
        cpu->gemm(gemm(a.data(), b.data(), bias.data(), c.data()));
        BiasedMatmul epilogue(nullptr, false);
        ASSERT_TRUE(epilogue.run(gemm(da.get(), db.get(), dbias.get(), dc.get())))
            << data_type_name(type) << " " << static_cast<int>(ta) << static_cast<int>(tb);
        expect_close(widened(*cpu, dc.host(), type), widened(*cpu, c, type),
                     type == DataType::float32 ? 1e-5 : 1.0 / 128);
      }
}

// GELU forward in 16-byte packs (a count of whole packs, aligned) against the CPU's.
TEST_F(CudaKernelsTest, GeluForwardInPacks) {
  const std::int64_t rows = 48, cols = 64;
  for (DataType type : {DataType::float32, DataType::bfloat16}) {
    const auto pre = typed(*cpu, random_values(static_cast<std::size_t>(rows * cols), 53, -6.0f, 6.0f), type);
    std::vector<std::uint8_t> activated(pre.size());
    DeviceArray<std::uint8_t> dpre(pre), dactivated(activated);
    cpu->gelu_forward(pre.data(), activated.data(), rows, cols, type);
    gpu->gelu_forward(dpre.get(), dactivated.get(), rows, cols, type);
    expect_close(widened(*cpu, dactivated.host(), type), widened(*cpu, activated, type),
                 type == DataType::float32 ? 1e-5 : 1.0 / 128);
  }
}

// Column sums at a size where the two stages split the rows into many blocks, packed (aligned,
// whole packs) and not (an odd width): each column within the bound on two fp32 sums of the same
// values in different orders, rows x 2^-23 x the sum of their magnitudes.
TEST_F(CudaKernelsTest, ColumnSumsOfManyRowsAndGeluBackwardInOnePass) {
  for (DataType type : {DataType::float32, DataType::bfloat16})
    for (std::int64_t cols : {1024, 1000, 77}) {  // whole tiles of packs, a part tile, no packs
      const std::int64_t rows = 3000;
      const auto size = static_cast<std::size_t>(rows * cols);
      const auto upstream = typed(*cpu, random_values(size, 30), type), pre = typed(*cpu, random_values(size, 31), type);
      std::vector<std::uint8_t> grad_pre(size * size_of(type));
      std::vector<float> sums(static_cast<std::size_t>(cols)), magnitudes(static_cast<std::size_t>(cols), 0.0f);
      cpu->gelu_backward(upstream.data(), pre.data(), grad_pre.data(), type, sums.data(), DataType::float32, false, rows, cols);
      DeviceArray<std::uint8_t> dupstream(upstream), dpre(pre), dgrad_pre(grad_pre);
      DeviceArray<float> dsums(std::vector<float>(static_cast<std::size_t>(cols), 7.0f));
      gpu->gelu_backward(dupstream.get(), dpre.get(), dgrad_pre.get(), type, dsums.get(), DataType::float32, false, rows, cols);
      const auto gpu_grad = widened(*cpu, dgrad_pre.host(), type), cpu_grad = widened(*cpu, grad_pre, type);
      // GELU' in the GPU's erff against the CPU's polynomial: the rounded gradients one step apart at most.
      expect_close(gpu_grad, cpu_grad, type == DataType::float32 ? 1e-5 : 1.0 / 128);
      for (std::size_t i = 0; i < size; ++i) magnitudes[i % static_cast<std::size_t>(cols)] += std::fabs(cpu_grad[i]);
      const auto gpu_sums = dsums.host();
      for (std::int64_t col = 0; col < cols; ++col)
        ASSERT_LE(std::fabs(gpu_sums[col] - sums[col]), rows * std::ldexp(magnitudes[col], -23) + 1e-3)
            << data_type_name(type) << " column " << col << " of " << cols;
      // The column sums alone, accumulated into the sums.
      std::vector<float> again = sums;
      cpu->column_sums(grad_pre.data(), type, again.data(), DataType::float32, true, rows, cols);
      gpu->column_sums(dgrad_pre.get(), type, dsums.get(), DataType::float32, true, rows, cols);
      const auto gpu_again = dsums.host();
      for (std::int64_t col = 0; col < cols; ++col)
        ASSERT_LE(std::fabs(gpu_again[col] - again[col]), 2 * rows * std::ldexp(magnitudes[col], -23) + 1e-3) << col;
    }
  // Small integers: every order of the fp32 sums is exact, so the sums are the CPU's exactly (a
  // row left out or counted twice shows).
  for (std::int64_t cols : {1024, 1000, 77}) {
    const std::int64_t rows = 3001;
    std::vector<float> data(static_cast<std::size_t>(rows * cols)), sums(static_cast<std::size_t>(cols));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(static_cast<int>((i * 7919) % 17) - 8);
    cpu->column_sums(data.data(), sums.data(), false, rows, cols);
    DeviceArray<float> ddata(data), dsums(std::vector<float>(static_cast<std::size_t>(cols)));
    gpu->column_sums(ddata.get(), dsums.get(), false, rows, cols);
    EXPECT_EQ(dsums.host(), sums) << cols << " columns";
  }
}

// AdamW over more ranges than one launch takes, some not counted in the norm, with a bf16 copy.
TEST_F(CudaKernelsTest, AdamWOverManyRangesInOneLaunchEach) {
  const std::size_t ranges = 45;
  std::vector<std::size_t> counts(ranges);
  for (std::size_t r = 0; r < ranges; ++r) counts[r] = 1 + (r * 7919) % 3001;
  counts[0] = counts[39] = 0;  // empty ranges, passed over (the next launch must not repeat any)
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  auto master = random_values(total, 40), exp_avg = random_values(total, 41, -0.1f, 0.1f),
       exp_avg_sq = random_values(total, 42, 0.0f, 0.01f);
  const auto grads = random_values(total, 43);
  std::vector<std::uint16_t> copy(total);
  DeviceArray<float> dmaster(master), dexp_avg(exp_avg), dexp_avg_sq(exp_avg_sq), dgrads(grads);
  DeviceArray<std::uint16_t> dcopy(copy);
  std::vector<AdamWRange> on_cpu, on_gpu;
  std::size_t at = 0;
  for (std::size_t r = 0; r < ranges; ++r) {
    on_cpu.push_back({master.data() + at, grads.data() + at, exp_avg.data() + at, exp_avg_sq.data() + at, counts[r],
                      copy.data() + at, r % 3 != 0});
    on_gpu.push_back({dmaster.get() + at, dgrads.get() + at, dexp_avg.get() + at, dexp_avg_sq.get() + at, counts[r],
                      dcopy.get() + at, r % 3 != 0});
    at += counts[r];
  }
  const AdamWStep step{.learning_rate = 1e-2, .weight_decay = 0.1, .step = 5, .grad_scale = 0.5f};
  const double cpu_sum = cpu->adamw(on_cpu, DataType::float32, step, DataType::bfloat16);
  const double gpu_sum = gpu->adamw(on_gpu, DataType::float32, step, DataType::bfloat16);
  EXPECT_NEAR(gpu_sum, cpu_sum, 1e-9 * cpu_sum);
  expect_close(dmaster.host(), master);
  expect_close(dexp_avg.host(), exp_avg);
  expect_close(dexp_avg_sq.host(), exp_avg_sq);
  const auto gpu_copy = dcopy.host();
  std::size_t differing = 0;
  for (std::size_t i = 0; i < total; ++i) differing += gpu_copy[i] != copy[i];
  EXPECT_LE(differing, total / 1000) << "bf16 copies that differ (the masters may differ in their last bit)";
}

// The built-in datasets generated on the GPU are the samples the CPU reads, bit for bit.
TEST_F(CudaKernelsTest, SamplesGeneratedOnTheGpuAreTheCpusBitForBit) {
  const std::vector<std::int64_t> indices = {0, 3, 65535, 1000, 1000, 77};
  for (DatasetKind kind : {DatasetKind::teacher, DatasetKind::mixture}) {
    auto dataset = open_dataset({.kind = kind, .input_dim = 1000, .output_dim = 7});
    const bool teacher = kind == DatasetKind::teacher;
    const SyntheticSamples host_samples = *dataset->synthetic();
    DeviceArray<float> dfirst(std::vector<float>(host_samples.first_table,
                                                 host_samples.first_table + (teacher ? 1000 * teacher_hidden_units : 7 * 1000)));
    DeviceArray<float> dsecond(teacher ? std::vector<float>(host_samples.second_table,
                                                            host_samples.second_table + 7 * teacher_hidden_units)
                                       : std::vector<float>(1));
    SyntheticSamples device_samples = host_samples;
    device_samples.first_table = dfirst.get();
    device_samples.second_table = teacher ? dsecond.get() : nullptr;
    for (Split split : {Split::train, Split::test}) {
      std::vector<float> inputs(indices.size() * 1000), targets(indices.size() * 7);
      std::vector<std::int32_t> labels(indices.size());
      dataset->read(split, indices, inputs.data(), teacher ? targets.data() : nullptr, teacher ? nullptr : labels.data());
      std::vector<std::uint64_t> stream(indices.size());
      for (std::size_t i = 0; i < indices.size(); ++i) stream[i] = synthetic_stream_index(split, indices[i]);
      DeviceArray<std::uint64_t> dstream(stream);
      DeviceArray<float> dinputs(std::vector<float>(inputs.size())), dtargets(std::vector<float>(targets.size()));
      DeviceArray<std::int32_t> dlabels(std::vector<std::int32_t>(labels.size()));
      const auto count = static_cast<std::int64_t>(indices.size());
      gpu->generate_samples(device_samples, dstream.get(), count, dinputs.get(), teacher ? dtargets.get() : nullptr,
                            teacher ? nullptr : dlabels.get());
      EXPECT_EQ(dinputs.host(), inputs);
      if (teacher) EXPECT_EQ(dtargets.host(), targets);
      else EXPECT_EQ(dlabels.host(), labels);
      // Without the inputs (the loss's side of a pipeline): the same targets or labels.
      DeviceArray<float> dtargets_alone(std::vector<float>(targets.size()));
      DeviceArray<std::int32_t> dlabels_alone(std::vector<std::int32_t>(labels.size()));
      gpu->generate_samples(device_samples, dstream.get(), count, nullptr, teacher ? dtargets_alone.get() : nullptr,
                            teacher ? nullptr : dlabels_alone.get());
      if (teacher) EXPECT_EQ(dtargets_alone.host(), targets);
      else EXPECT_EQ(dlabels_alone.host(), labels);
    }
  }
}

TEST(CudaAllocator, ChargesTheLedgerAndReusesFreedBlocks) {
  MemoryLedger ledger;
  auto allocator = make_cuda_allocator(ledger, nullptr);
  EXPECT_EQ(allocator->device(), Device::cuda);
  void* first = nullptr;
  {
    Buffer buffer = allocator->allocate(MemoryState::activations, 4096);
    first = buffer.floats();
    EXPECT_EQ(ledger.current()[static_cast<int>(MemoryState::activations)], 4096);
    EXPECT_EQ(cudaMemset(buffer.floats(), 0, 4096), cudaSuccess);
  }
  EXPECT_EQ(ledger.current()[static_cast<int>(MemoryState::activations)], 0);
  Buffer again = allocator->allocate(MemoryState::grads, 4096);
  EXPECT_EQ(again.floats(), first);
}

TEST(CudaAllocator, CopiesInTheBackgroundThroughPinnedMemory) {
  MemoryLedger ledger;
  auto allocator = make_cuda_allocator(ledger, nullptr);
  auto copier = allocator->make_async_copier(2);
  ASSERT_NE(copier, nullptr);
  const std::size_t count = std::size_t{1} << 20, bytes = count * sizeof(float);
  Buffer device = allocator->allocate_floats(MemoryState::workspace, count);
  Buffer host = copier->host_memory().allocate_floats(MemoryState::comm_buffers, count);
  EXPECT_FALSE(allocator->is_device_memory(host.floats()));
  std::vector<float> values(count);
  for (std::size_t index = 0; index < count; ++index) values[index] = static_cast<float>(index % 977);
  allocator->copy_to_device(device.floats(), values.data(), bytes);
  copier->start_to_host(0, host.floats(), device.floats(), bytes);
  copier->wait_to_host(0);
  EXPECT_EQ(std::vector<float>(host.floats(), host.floats() + count), values);
  for (std::size_t index = 0; index < count; ++index) host.floats()[index] *= 2;
  copier->start_to_device(1, device.floats(), host.floats(), bytes);
  copier->wait_to_device(1);
  std::vector<float> back(count);
  allocator->copy_to_host(back.data(), device.floats(), bytes);
  for (std::size_t index = 0; index < count; ++index) ASSERT_EQ(back[index], 2 * values[index]) << index;
}

}  // namespace

int main(int argc, char** argv) {
  std::string why_none;
  if (cuda_device_count(&why_none) == 0) {
    std::printf("test_cuda_kernels: skipped: %s (these tests need a GPU)\n", why_none.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
