// The CPU backend: GEMMs through oneDNN (onednn_matmul.hpp), elementwise ops as plain loops over
// vector_math's branch-free functions so that the compiler vectorizes them, and reductions over
// fixed lanes of double partial sums, which vectorize without reassociation flags and give the
// same sum wherever the data sits in memory.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <stdexcept>
#include <vector>

#include "core/half_float.hpp"
#include "core/vector_math.hpp"
#include "kernels/cpu/onednn_matmul.hpp"
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

// One conversion loop per pair of types, each a plain loop over core/half_float.hpp's branch-free
// conversions, so each vectorizes.
template <typename From, typename To, typename Convert>
void convert_loop(const void* source, void* destination, std::size_t count, Convert convert) {
  const From* __restrict in = static_cast<const From*>(source);
  To* __restrict out = static_cast<To*>(destination);
  for (std::size_t i = 0; i < count; ++i) out[i] = convert(in[i]);
}

void convert_elements(const void* source, DataType from, void* destination, DataType to,
                      std::size_t count) {
  using Bits = std::uint16_t;
  if (from == to) {
    if (count > 0) std::memmove(destination, source, count * size_of(from));
  } else if (from == DataType::float32 && to == DataType::bfloat16) {
    convert_loop<float, Bits>(source, destination, count, round_to_bfloat16);
  } else if (from == DataType::float32 && to == DataType::float16) {
    convert_loop<float, Bits>(source, destination, count, round_to_float16);
  } else if (from == DataType::bfloat16 && to == DataType::float32) {
    convert_loop<Bits, float>(source, destination, count, bfloat16_to_float);
  } else if (from == DataType::float16 && to == DataType::float32) {
    convert_loop<Bits, float>(source, destination, count, float16_to_float);
  } else if (is_half(from) && is_half(to)) {  // through fp32, which holds either exactly
    const Bits* in = static_cast<const Bits*>(source);
    Bits* out = static_cast<Bits*>(destination);
    for (std::size_t i = 0; i < count; ++i)
      out[i] = from == DataType::bfloat16 ? round_to_float16(bfloat16_to_float(in[i]))
                                          : round_to_bfloat16(float16_to_float(in[i]));
  } else {
    throw std::logic_error(fmt::format("no conversion from {} to {}", data_type_name(from),
                                       data_type_name(to)));
  }
}

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::cpu; }

  std::string description() const override {
    return fmt::format("{}; {} GEMM thread(s)", matmul_.description(), omp_get_max_threads());
  }

  void gemm(const Gemm& gemm) override {
    if (gemm.m == 0 || gemm.n == 0) return;
    if (gemm.k == 0) {  // c = beta * c, with zeros (not 0 * garbage) when beta is 0, as BLAS does
      scale_matrix(gemm);
      return;
    }
    matmul_.run(gemm);
  }

  void convert(const void* source, DataType source_type, void* destination,
               DataType destination_type, std::size_t count) override {
    convert_elements(source, source_type, destination, destination_type, count);
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

 private:
  // c = beta * c row by row, in c's element type.
  void scale_matrix(const Gemm& gemm) {
    const std::size_t element = size_of(gemm.output);
    for (std::int64_t row = 0; row < gemm.m; ++row) {
      void* c_row = static_cast<char*>(gemm.c) + static_cast<std::size_t>(row * gemm.ldc) * element;
      const auto columns = static_cast<std::size_t>(gemm.n);
      if (gemm.beta == 0.0f) {
        std::memset(c_row, 0, columns * element);
      } else if (gemm.beta != 1.0f) {
        std::vector<float> widened(columns);
        convert_elements(c_row, gemm.output, widened.data(), DataType::float32, columns);
        scale(widened.data(), columns, gemm.beta);
        convert_elements(widened.data(), DataType::float32, c_row, gemm.output, columns);
      }
    }
  }

  OneDnnMatmul matmul_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

int set_cpu_gemm_threads(int threads) {
  if (std::getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads(std::max(1, threads));
  return omp_get_max_threads();
}

}  // namespace mlptrain
