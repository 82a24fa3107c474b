// The CUDA kernels against the CPU backend on the same random inputs, and the device allocator
// against the ledger. Without a GPU the binary says why and exits 77, which Meson counts as a skip.
#include <cstdio>
#include <string>

#include "tests/kernels/cuda_test_support.hpp"

using namespace mlptrain;
using namespace mlptrain::test;

namespace {

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
