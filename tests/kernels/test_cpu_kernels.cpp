// CPU kernels against naive double-precision references.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/rng.hpp"
#include "kernels/kernels.hpp"

using namespace mlptrain;

namespace {

std::vector<float> random_values(std::size_t count, std::uint64_t seed, float low = -2.0f,
                                 float high = 2.0f) {
  std::vector<float> values(count);
  CounterRng(seed, "kernel-test").fill_uniform(values.data(), 0, count, low, high);
  return values;
}

double gelu_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_derivative_reference(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

class CpuKernelsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
};

}  // namespace

TEST_F(CpuKernelsTest, GemmMatchesNaiveForEveryTransposeAlphaBeta) {
  const std::int64_t m = 7, n = 5, k = 9;
  for (Transpose ta : {Transpose::no, Transpose::yes}) {
    for (Transpose tb : {Transpose::no, Transpose::yes}) {
      const auto a = random_values(m * k, 1), b = random_values(k * n, 2);
      auto c = random_values(m * n, 3);
      const auto c_before = c;
      const std::int64_t lda = ta == Transpose::no ? k : m, ldb = tb == Transpose::no ? n : k;
      kernels->gemm(ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), n);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            const double av = ta == Transpose::no ? a[i * k + p] : a[p * m + i];
            const double bv = tb == Transpose::no ? b[p * n + j] : b[j * k + p];
            sum += av * bv;
          }
          EXPECT_NEAR(c[i * n + j], 0.75 * sum + 0.5 * c_before[i * n + j], 1e-5);
        }
    }
  }
}

TEST_F(CpuKernelsTest, GemmWithEmptyInnerDimensionScalesOutput) {
  std::vector<float> c = {1, 2, std::nanf(""), 4};  // beta 0 overwrites, even NaN
  kernels->gemm(Transpose::yes, Transpose::no, 2, 2, 0, 1.0f, nullptr, 2, nullptr, 2, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
}

TEST_F(CpuKernelsTest, GeluForwardMatchesErfForm) {
  const std::int64_t rows = 13, cols = 37;
  const auto pre = random_values(rows * cols, 4, -7.0f, 7.0f);
  std::vector<float> out(rows * cols);
  kernels->gelu_forward(pre.data(), out.data(), rows, cols);
  for (std::int64_t i = 0; i < rows * cols; ++i)
    EXPECT_NEAR(out[i], gelu_reference(pre[i]), 1e-6 * std::max(1.0, std::abs(static_cast<double>(pre[i]))));
}

TEST_F(CpuKernelsTest, GemmAddsItsBiasToEveryRow) {
  const std::int64_t m = 7, n = 13, k = 21;
  const auto a = random_values(m * k, 11), b = random_values(n * k, 12), bias = random_values(n, 13);
  std::vector<float> c(m * n);
  kernels->gemm({.transpose_b = Transpose::yes, .m = m, .n = n, .k = k, .a = a.data(), .lda = k, .b = b.data(),
                 .ldb = k, .c = c.data(), .ldc = n, .bias = bias.data()});
  for (std::int64_t row = 0; row < m; ++row)
    for (std::int64_t col = 0; col < n; ++col) {
      double expected = bias[col];
      for (std::int64_t i = 0; i < k; ++i) expected += static_cast<double>(a[row * k + i]) * b[col * k + i];
      EXPECT_NEAR(c[row * n + col], expected, 1e-5) << row << "," << col;
    }
}

TEST_F(CpuKernelsTest, GeluBackwardAndBiasGradient) {
  const std::int64_t rows = 11, cols = 29;
  const auto pre = random_values(rows * cols, 6, -6.0f, 6.0f);
  const auto upstream = random_values(rows * cols, 7);
  std::vector<float> grad(rows * cols), bias_grad(cols, 100.0f);
  for (bool accumulate : {false, true}) {
    const auto bias_before = bias_grad;
    kernels->gelu_backward(upstream.data(), pre.data(), grad.data(), bias_grad.data(), accumulate,
                           rows, cols);
    for (std::int64_t j = 0; j < cols; ++j) {
      double column = 0;
      for (std::int64_t i = 0; i < rows; ++i) {
        const double expected = upstream[i * cols + j] * gelu_derivative_reference(pre[i * cols + j]);
        EXPECT_NEAR(grad[i * cols + j], expected, 2e-6);
        column += expected;
      }
      EXPECT_NEAR(bias_grad[j], (accumulate ? bias_before[j] : 0.0) + column, 1e-4);
    }
  }
}

TEST_F(CpuKernelsTest, BiasAddAndColumnSums) {
  const std::int64_t rows = 6, cols = 19;
  auto data = random_values(rows * cols, 8);
  const auto original = data;
  const auto bias = random_values(cols, 9);
  kernels->bias_add(data.data(), bias.data(), rows, cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) EXPECT_FLOAT_EQ(data[i], original[i] + bias[i % cols]);
  std::vector<float> sums(cols, 1.0f);
  kernels->column_sums(original.data(), sums.data(), true, rows, cols);
  for (std::int64_t j = 0; j < cols; ++j) {
    double expected = 1.0;
    for (std::int64_t i = 0; i < rows; ++i) expected += original[i * cols + j];
    EXPECT_NEAR(sums[j], expected, 1e-5);
  }
}

TEST_F(CpuKernelsTest, MseSumAndGradient) {
  const std::int64_t rows = 9, cols = 21;
  const auto prediction = random_values(rows * cols, 10), target = random_values(rows * cols, 11);
  std::vector<float> grad(rows * cols);
  const double sum = kernels->mse(prediction.data(), target.data(), grad.data(), rows, cols, 0.25f);
  double expected = 0;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const double error = static_cast<double>(prediction[i]) - target[i];
    expected += error * error;
    EXPECT_NEAR(grad[i], 0.25 * 2.0 * error, 1e-6);
  }
  EXPECT_NEAR(sum, expected, 1e-9 * expected);
}

TEST_F(CpuKernelsTest, CrossEntropySumGradientAndArgmaxTies) {
  const std::int64_t rows = 5, cols = 4;
  auto logits = random_values(rows * cols, 12, -3.0f, 3.0f);
  logits[4 * cols + 1] = logits[4 * cols + 2] = 9.0f;  // a tie goes to the lower index
  const std::vector<std::int32_t> labels = {0, 3, 2, 1, 1};
  std::vector<float> grad(rows * cols);
  const CrossEntropyResult result =
      kernels->cross_entropy(logits.data(), labels.data(), grad.data(), rows, cols, 0.5f);
  double expected_loss = 0;
  std::int64_t expected_correct = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    double normalizer = 0;
    for (std::int64_t j = 0; j < cols; ++j) normalizer += std::exp(static_cast<double>(logits[i * cols + j]));
    expected_loss += std::log(normalizer) - logits[i * cols + labels[i]];
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < cols; ++j)
      if (logits[i * cols + j] > logits[i * cols + best]) best = j;
    expected_correct += best == labels[i];
    for (std::int64_t j = 0; j < cols; ++j) {
      const double probability = std::exp(static_cast<double>(logits[i * cols + j])) / normalizer;
      EXPECT_NEAR(grad[i * cols + j], 0.5 * (probability - (j == labels[i])), 1e-6);
    }
  }
  EXPECT_NEAR(result.loss_sum, expected_loss, 1e-5);
  EXPECT_EQ(result.correct, expected_correct);
  EXPECT_GE(result.correct, 1);  // row 4: the tie picks class 1, its label
}

// Over more elements than one thread's chunk, on one thread and on two: the torch formula
// either way, and the same bits (each chunk's sum of squares is its own, added in order).
TEST_F(CpuKernelsTest, AdamwMatchesTheTorchFormulaAndReturnsTheSquareSumOnAnyThreads) {
  const std::size_t count = 2 * 65536 + 1003;  // three chunks, not a multiple of the vector width
  const auto p0 = random_values(count, 13), m0 = random_values(count, 14, -0.1f, 0.1f),
             v0 = random_values(count, 15, 0.0f, 0.01f), grads = random_values(count, 16);
  const AdamWStep step{.learning_rate = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6,
                       .weight_decay = 0.1, .step = 3};
  const int threads_before = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  std::vector<double> sums;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    auto params = p0, exp_avg = m0, exp_avg_sq = v0;
    const double squares = kernels->adamw(params.data(), grads.data(), exp_avg.data(), exp_avg_sq.data(), count, step);
    double expected_squares = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double g = grads[i];
      expected_squares += g * g;
      const double m = 0.8 * m0[i] + 0.2 * g, v = 0.99 * v0[i] + 0.01 * g * g;
      const double p = p0[i] * (1 - 0.01 * 0.1) -
                       0.01 / (1 - std::pow(0.8, 3)) * m / (std::sqrt(v / (1 - std::pow(0.99, 3))) + 1e-6);
      ASSERT_NEAR(exp_avg[i], m, 1e-6) << i;
      ASSERT_NEAR(exp_avg_sq[i], v, 1e-7) << i;
      ASSERT_NEAR(params[i], p, 1e-5) << i;
    }
    EXPECT_NEAR(squares, expected_squares, 1e-9 * expected_squares);
    results.push_back(params);
    results.push_back(exp_avg);
    results.push_back(exp_avg_sq);
    sums.push_back(squares);
  }
  omp_set_num_threads(threads_before);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(results[i], results[i + 3]) << i;
  EXPECT_EQ(sums[0], sums[1]);
}

TEST_F(CpuKernelsTest, ElementwiseHelpers) {
  std::vector<float> data = random_values(101, 17);
  const auto original = data;
  double expected = 0;
  for (float value : original) expected += static_cast<double>(value) * value;
  EXPECT_NEAR(kernels->sum_of_squares(data.data(), data.size()), expected, 1e-9 * expected);
  kernels->scale(data.data(), data.size(), -2.0f);
  for (std::size_t i = 0; i < data.size(); ++i) EXPECT_FLOAT_EQ(data[i], -2.0f * original[i]);
  kernels->add(data.data(), original.data(), data.size());
  for (std::size_t i = 0; i < data.size(); ++i) EXPECT_FLOAT_EQ(data[i], -original[i]);
  kernels->copy(data.data(), original.data(), data.size());
  EXPECT_EQ(data, original);
  kernels->fill(data.data(), data.size(), 3.5f);
  for (float value : data) EXPECT_EQ(value, 3.5f);
}
