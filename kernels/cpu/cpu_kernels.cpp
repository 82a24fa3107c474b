// The CPU backend: GEMM through OpenBLAS (one thread per rank, set by the launcher's environment),
// elementwise ops as plain loops over vector_math's branch-free functions so that the compiler
// vectorizes them, and reductions over fixed lanes of double partial sums, which vectorize
// without reassociation flags and give the same sum wherever the data sits in memory.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/vector_math.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

namespace {

namespace vm = vector_math;
constexpr std::size_t lanes = 16;

// Sum over i of f(i) in double, lane-parallel.
template <typename Term>
double lane_sum(std::size_t count, Term term) {
  double partial[lanes] = {};
  const std::size_t whole = count / lanes * lanes;
  for (std::size_t base = 0; base < whole; base += lanes)
    for (std::size_t lane = 0; lane < lanes; ++lane) partial[lane] += term(base + lane);
  double total = 0;
  for (std::size_t i = whole; i < count; ++i) total += term(i);
  for (double value : partial) total += value;
  return total;
}

inline float gelu(float x) { return x * vm::normal_cdf(x); }
inline float gelu_derivative(float x) { return vm::normal_cdf(x) + x * vm::normal_pdf(x); }

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::cpu; }

  void gemm(Transpose transpose_a, Transpose transpose_b, std::int64_t m, std::int64_t n,
            std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
            std::int64_t ldb, float beta, float* c, std::int64_t ldc) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // c = beta * c, with zeros (not 0 * garbage) when beta is 0, as BLAS does
      for (std::int64_t row = 0; row < m; ++row) {
        if (beta == 0.0f) {
          fill(c + row * ldc, static_cast<std::size_t>(n), 0.0f);
        } else {
          scale(c + row * ldc, static_cast<std::size_t>(n), beta);
        }
      }
      return;
    }
    cblas_sgemm(CblasRowMajor, transpose_a == Transpose::yes ? CblasTrans : CblasNoTrans,
                transpose_b == Transpose::yes ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }

  void bias_gelu_forward(float* pre, const float* bias, float* activated, std::int64_t rows,
                         std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      float* __restrict pre_row = pre + row * cols;
      float* __restrict out_row = activated + row * cols;
      for (std::int64_t col = 0; col < cols; ++col) {
        const float value = pre_row[col] + bias[col];
        pre_row[col] = value;
        out_row[col] = gelu(value);
      }
    }
  }

  void bias_add(float* data, const float* bias, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      float* __restrict data_row = data + row * cols;
      for (std::int64_t col = 0; col < cols; ++col) data_row[col] += bias[col];
    }
  }

  void gelu_backward(const float* grad_activated, const float* pre, float* grad_pre,
                     float* bias_grad, bool accumulate, std::int64_t rows,
                     std::int64_t cols) override {
    if (!accumulate) fill(bias_grad, static_cast<std::size_t>(cols), 0.0f);
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* __restrict upstream = grad_activated + row * cols;
      const float* __restrict input = pre + row * cols;
      float* __restrict out = grad_pre + row * cols;
      float* __restrict sums = bias_grad;
      for (std::int64_t col = 0; col < cols; ++col) {
        const float value = upstream[col] * gelu_derivative(input[col]);
        out[col] = value;
        sums[col] += value;
      }
    }
  }

  void column_sums(const float* data, float* sums, bool accumulate, std::int64_t rows,
                   std::int64_t cols) override {
    if (!accumulate) fill(sums, static_cast<std::size_t>(cols), 0.0f);
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* __restrict data_row = data + row * cols;
      float* __restrict out = sums;
      for (std::int64_t col = 0; col < cols; ++col) out[col] += data_row[col];
    }
  }

  double mse(const float* prediction, const float* target, float* grad, std::int64_t rows,
             std::int64_t cols, float grad_scale) override {
    const auto count = static_cast<std::size_t>(rows * cols);
    if (grad != nullptr) {
      const float factor = 2.0f * grad_scale;
      for (std::size_t i = 0; i < count; ++i) grad[i] = factor * (prediction[i] - target[i]);
    }
    return lane_sum(count, [&](std::size_t i) {
      const double error = static_cast<double>(prediction[i]) - target[i];
      return error * error;
    });
  }

  CrossEntropyResult cross_entropy(const float* logits, const std::int32_t* labels, float* grad,
                                   std::int64_t rows, std::int64_t cols,
                                   float grad_scale) override {
    CrossEntropyResult result;
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* row_logits = logits + row * cols;
      const std::int64_t best = std::max_element(row_logits, row_logits + cols) - row_logits;
      const float largest = row_logits[best];
      double normalizer = 0;
      for (std::int64_t col = 0; col < cols; ++col)
        normalizer += std::exp(static_cast<double>(row_logits[col] - largest));
      const std::int32_t label = labels[row];
      result.loss_sum += std::log(normalizer) - (row_logits[label] - largest);
      result.correct += best == label ? 1 : 0;
      if (grad != nullptr) {
        float* row_grad = grad + row * cols;
        for (std::int64_t col = 0; col < cols; ++col) {
          const double probability = std::exp(row_logits[col] - largest) / normalizer;
          row_grad[col] = grad_scale * static_cast<float>(probability - (col == label ? 1 : 0));
        }
      }
    }
    return result;
  }

  void softmax_rows(float* data, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      float* values = data + row * cols;
      const float largest = *std::max_element(values, values + cols);
      double total = 0;
      for (std::int64_t col = 0; col < cols; ++col) total += std::exp(static_cast<double>(values[col] - largest));
      for (std::int64_t col = 0; col < cols; ++col)
        values[col] = static_cast<float>(std::exp(static_cast<double>(values[col] - largest)) / total);
    }
  }

  void softmax_backward_rows(const float* probabilities, const float* grad_probabilities,
                             float* grad_logits, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* p = probabilities + row * cols;
      const float* g = grad_probabilities + row * cols;
      double inner = 0;
      for (std::int64_t col = 0; col < cols; ++col) inner += static_cast<double>(p[col]) * g[col];
      float* out = grad_logits + row * cols;
      for (std::int64_t col = 0; col < cols; ++col)
        out[col] = static_cast<float>(p[col] * (g[col] - inner));
    }
  }

  void gather_rows(const float* source, const std::int32_t* indices, const float* scales,
                   float* destination, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* __restrict in = source + static_cast<std::int64_t>(indices[row]) * cols;
      float* __restrict out = destination + row * cols;
      const float factor = scales != nullptr ? scales[row] : 1.0f;
      for (std::int64_t col = 0; col < cols; ++col) out[col] = factor * in[col];
    }
  }

  void scatter_add_rows(const float* source, const std::int32_t* indices, const float* scales,
                        float* destination, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* __restrict in = source + row * cols;
      float* __restrict out = destination + static_cast<std::int64_t>(indices[row]) * cols;
      const float factor = scales != nullptr ? scales[row] : 1.0f;
      for (std::int64_t col = 0; col < cols; ++col) out[col] += factor * in[col];
    }
  }

  void row_dots(const float* a, const std::int32_t* indices, const float* b, float* dots,
                std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* left = a + static_cast<std::int64_t>(indices[row]) * cols;
      const float* right = b + row * cols;
      dots[row] = static_cast<float>(lane_sum(static_cast<std::size_t>(cols), [&](std::size_t i) {
        return static_cast<double>(left[i]) * right[i];
      }));
    }
  }

  double adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
               std::size_t count, const AdamWStep& step) override {
    // The scalars are formed as torch.optim.AdamW forms them: in double, then used as float.
    const double correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
    const double correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
    const auto step_size = static_cast<float>(step.learning_rate / correction1);
    const auto correction2_sqrt = static_cast<float>(std::sqrt(correction2));
    const auto decay = static_cast<float>(1.0 - step.learning_rate * step.weight_decay);
    const auto beta1 = static_cast<float>(step.beta1), beta2 = static_cast<float>(step.beta2),
               eps = static_cast<float>(step.eps);
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    float* __restrict p = params;
    const float* __restrict g = grads;
    float* __restrict m = exp_avg;
    float* __restrict v = exp_avg_sq;
    auto update = [&](std::size_t i) {
      const float gradient = g[i];
      const float first = m[i] * beta1 + one_minus_beta1 * gradient;
      const float second = v[i] * beta2 + one_minus_beta2 * gradient * gradient;
      m[i] = first;
      v[i] = second;
      const float denominator = std::sqrt(second) / correction2_sqrt + eps;
      p[i] = p[i] * decay - step_size * (first / denominator);
      return static_cast<double>(gradient) * gradient;
    };
    return lane_sum(count, update);
  }

  double sum_of_squares(const float* data, std::size_t count) override {
    return lane_sum(count, [data](std::size_t i) {
      const double value = data[i];
      return value * value;
    });
  }

  void scale(float* data, std::size_t count, float factor) override {
    for (std::size_t i = 0; i < count; ++i) data[i] *= factor;
  }
  void fill(float* data, std::size_t count, float value) override {
    std::fill(data, data + count, value);
  }
  void copy(float* destination, const float* source, std::size_t count) override {
    if (count > 0) std::memcpy(destination, source, count * sizeof(float));
  }
  void add(float* destination, const float* source, std::size_t count) override {
    float* __restrict out = destination;
    const float* __restrict in = source;
    for (std::size_t i = 0; i < count; ++i) out[i] += in[i];
  }
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() {
  // One BLAS thread per rank unless the user asks otherwise: ranks already fill the cores.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
  return std::make_unique<CpuKernels>();
}

}  // namespace mlptrain
