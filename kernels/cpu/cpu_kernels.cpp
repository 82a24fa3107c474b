// The CPU backend: GEMMs through oneDNN (onednn_matmul.hpp), elementwise ops as plain loops over
// vector_math's branch-free functions, written once for every element type (core/elements.hpp) so that
// the compiler vectorizes each, and reductions over fixed lanes of double partial sums
// (element_loops.hpp); AdamW (adamw_update.hpp) and the fp8 operands (fp8_kernels.hpp) apart.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "core/vector_math.hpp"
#include "core/elements.hpp"
#include "kernels/cpu/adamw_update.hpp"
#include "kernels/cpu/element_loops.hpp"
#include "kernels/cpu/fp8_kernels.hpp"
#include "kernels/cpu/gelu_rows.hpp"
#include "kernels/cpu/onednn_matmul.hpp"
#include "kernels/cpu/row_moves.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

namespace {

namespace vm = vector_math;
using cpu_loops::convert_elements;
using cpu_loops::lane_sum;
template <typename E>
[[gnu::noinline]] void bias_add_row(Row<E> data, ConstRow<E> bias, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) data[col] = E::store(E::load(data[col]) + E::load(bias[col]));
}

template <typename E>
[[gnu::noinline]] void column_sum_row(ConstRow<E> data, float* __restrict running, std::int64_t cols) {
  for (std::int64_t col = 0; col < cols; ++col) running[col] += E::load(data[col]);
}

// Column sums over `rows` rows in fp32, add_row(row, running) adding one row into them: started
// from the sums' own values when accumulating, and rounded once into them (with fp32 sums,
// exactly adding row by row into them).
template <typename AddRow>
void column_sums_into(void* sums, DataType sums_type, bool accumulate, std::int64_t rows, std::int64_t cols,
                      AddRow add_row) {
  with_element(sums_type, [&](auto sums_element) {
    using Sums = decltype(sums_element);
    auto* out = elements<Sums>(sums);
    std::vector<float> total(static_cast<std::size_t>(cols), 0.0f);
    if (accumulate)
      for (std::int64_t col = 0; col < cols; ++col) total[col] = Sums::load(out[col]);
    for (std::int64_t row = 0; row < rows; ++row) add_row(row, total.data());
    for (std::int64_t col = 0; col < cols; ++col) out[col] = Sums::store(total[col]);
  });
}

class CpuKernels final : public Kernels {
 public:
  using Kernels::gelu_forward, Kernels::bias_add, Kernels::gelu_backward, Kernels::column_sums,
      Kernels::gather_rows, Kernels::sum_token_rows, Kernels::row_dots, Kernels::adamw,
      Kernels::sum_of_squares, Kernels::scale, Kernels::fill, Kernels::add;

  Device device() const override { return Device::cpu; }

  std::string description() const override {
    return fmt::format("{}; {} GEMM thread(s)", matmul_.description(), omp_get_max_threads());
  }

  void gemm(const Gemm& gemm) override {
    if (gemm.m == 0 || gemm.n == 0) return;
    if (gemm.k == 0) {  // c = beta * c, with zeros (not 0 * garbage) when beta is 0, as BLAS does
      for (std::int64_t row = 0; row < gemm.m; ++row) {
        void* c_row = static_cast<char*>(gemm.c) + static_cast<std::size_t>(row * gemm.ldc) * size_of(gemm.output);
        if (gemm.beta == 0.0f) {
          std::memset(c_row, 0, static_cast<std::size_t>(gemm.n) * size_of(gemm.output));
        } else if (gemm.beta != 1.0f) {
          scale(c_row, gemm.output, static_cast<std::size_t>(gemm.n), gemm.beta);
        }
      }
      return;
    }
    matmul_.run(gemm);
  }

  void convert(const void* source, DataType source_type, void* destination, DataType destination_type,
               std::size_t count) override {
    convert_elements(source, source_type, destination, destination_type, count);
  }

  void gelu_forward(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      if constexpr (std::is_same_v<E, Fp32>) {
        gelu_row<E>(elements<E>(pre), elements<E>(activated), rows * cols);
      } else {
        gelu_row(elements<E>(pre), elements<E>(activated), gelu_table<E>().activated.data(), rows * cols);
      }
    });
  }

  void bias_add(void* data, const void* bias, std::int64_t rows, std::int64_t cols, DataType type) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      for (std::int64_t row = 0; row < rows; ++row) bias_add_row<E>(elements<E>(data) + row * cols, elements<E>(bias), cols);
    });
  }

  void gelu_backward(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                     DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols) override {
    gelu_backward_rows(grad_activated, pre, grad_pre, type, bias_grad, bias_grad_type, accumulate, rows, cols,
                       [](std::int64_t) {});
  }

  // The amax of each block taken while it is in cache.
  void convert_amax(const void* source, DataType source_type, void* destination, DataType destination_type,
                    std::size_t count, float* amax) override {
    constexpr std::size_t block = 1 << 14;
    float largest = 0.0f;
    for (std::size_t first = 0; first < count; first += block) {
      const std::size_t size = std::min(block, count - first);
      void* out = advance(destination, first, destination_type);
      convert_elements(advance(source, first, source_type), source_type, out, destination_type, size);
      largest = cpu_fp8::larger_magnitude(
          largest, cpu_fp8::largest_magnitude(out, destination_type, static_cast<std::int64_t>(size)));
    }
    amax[0] = largest;
  }
  // The amax of each block of rows taken while it is in cache.
  void gelu_forward_amax(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type,
                         float* amax) override {
    constexpr std::int64_t block_rows = 16;
    float largest = 0.0f;
    for (std::int64_t first = 0; first < rows; first += block_rows) {
      const std::int64_t block = std::min(block_rows, rows - first);
      const auto at = static_cast<std::size_t>(first * cols);
      void* out = advance(activated, at, type);
      gelu_forward(advance(pre, at, type), out, block, cols, type);
      largest = cpu_fp8::larger_magnitude(largest, cpu_fp8::largest_magnitude(out, type, block * cols));
    }
    amax[0] = largest;
  }
  void gelu_backward_amax(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                          DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols,
                          float* amax) override {
    float largest = 0.0f;
    gelu_backward_rows(grad_activated, pre, grad_pre, type, bias_grad, bias_grad_type, accumulate, rows, cols,
                       [&](std::int64_t row) {
                         const void* stored = advance(grad_pre, static_cast<std::size_t>(row * cols), type);
                         largest = cpu_fp8::larger_magnitude(largest, cpu_fp8::largest_magnitude(stored, type, cols));
                       });
    amax[0] = largest;
  }

  void column_sums(const void* data, DataType type, void* sums, DataType sums_type, bool accumulate,
                   std::int64_t rows, std::int64_t cols) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      column_sums_into(sums, sums_type, accumulate, rows, cols, [&](std::int64_t row, float* running) {
        column_sum_row<E>(elements<E>(data) + row * cols, running, cols);
      });
    });
  }

  double mse(const float* prediction, const float* target, float* grad, std::int64_t rows, std::int64_t cols,
             float grad_scale) override {
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

  CrossEntropyResult cross_entropy(const float* logits, const std::int32_t* labels, float* grad, std::int64_t rows,
                                   std::int64_t cols, float grad_scale) override {
    CrossEntropyResult result;
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* row_logits = logits + row * cols;
      const std::int64_t best = std::max_element(row_logits, row_logits + cols) - row_logits;
      const float largest = row_logits[best];
      double normalizer = 0;
      for (std::int64_t col = 0; col < cols; ++col) normalizer += std::exp(static_cast<double>(row_logits[col] - largest));
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

  void softmax_backward_rows(const float* probabilities, const float* grad_probabilities, float* grad_logits,
                             std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float* p = probabilities + row * cols;
      const float* g = grad_probabilities + row * cols;
      double inner = 0;
      for (std::int64_t col = 0; col < cols; ++col) inner += static_cast<double>(p[col]) * g[col];
      float* out = grad_logits + row * cols;
      for (std::int64_t col = 0; col < cols; ++col) out[col] = static_cast<float>(p[col] * (g[col] - inner));
    }
  }

  void gather_rows(const void* source, const std::int32_t* indices, const float* scales, void* destination,
                   std::int64_t rows, std::int64_t cols, DataType type) override {
    with_element(type, [&](auto element) {
      gather_rows_of<decltype(element)>(source, indices, scales, destination, rows, cols);
    });
  }

  void sum_token_rows(const void* source, DataType source_type, const std::int32_t* row_begin,
                      const std::int32_t* rows, const float* scales, void* destination, DataType destination_type,
                      std::int64_t tokens, std::int64_t cols) override {
    with_element(source_type, [&](auto source_element) {
      with_element(destination_type, [&](auto destination_element) {
        sum_token_rows_of<decltype(source_element), decltype(destination_element)>(source, row_begin, rows, scales,
                                                                                   destination, tokens, cols);
      });
    });
  }

  void row_dots(const void* a, const std::int32_t* indices, const void* b, float* dots, std::int64_t rows,
                std::int64_t cols, DataType type) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      for (std::int64_t row = 0; row < rows; ++row) {
        const auto* left = elements<E>(a) + static_cast<std::int64_t>(indices[row]) * cols;
        const auto* right = elements<E>(b) + row * cols;
        dots[row] = static_cast<float>(lane_sum(static_cast<std::size_t>(cols), [&](std::size_t i) {
          return static_cast<double>(E::load(left[i])) * E::load(right[i]);
        }));
      }
    });
  }

  void generate_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::int64_t count,
                        float* inputs, float* targets, std::int32_t* labels) override {
    generate_builtin_samples(samples, stream_indices, static_cast<std::size_t>(count), inputs, targets, labels);
  }

  double adamw(float* master, const void* grads, DataType grads_type, float* exp_avg, float* exp_avg_sq,
               std::size_t count, const AdamWStep& step, void* compute_copy, DataType compute_type) override {
    return adamw_update(master, grads, grads_type, exp_avg, exp_avg_sq, count, step, compute_copy, compute_type);
  }

  void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    float* amax) override {
    cpu_fp8::absolute_max(data, type, rows, cols, scaling, amax);
  }
  void quantize_fp8(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes,
                    float* inverse_scales) override {
    cpu_fp8::quantize(data, type, rows, cols, scaling, amax, format, layout, codes, inverse_scales);
  }
  void quantize_fp8_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                         const Fp8Coding& summed_columns, const Fp8Coding& summed_rows,
                         Fp8CodeLayout summed_rows_layout) override {
    cpu_fp8::quantize_pair(data, type, rows, cols, format, summed_columns, summed_rows, summed_rows_layout);
  }
  // oneDNN reads a transposed operand through its strides: no transposing pass.
  Fp8CodeLayout fp8_summed_rows_layout() const override { return Fp8CodeLayout::as_is; }
  void fp8_gemm(const Fp8Gemm& call) override {
    cpu_fp8::gemm(call, [this](const Gemm& product) { gemm(product); });
  }
  std::size_t fp8_gemm_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k) const override {
    return cpu_fp8::gemm_workspace_bytes(m, n, k);
  }

  void encode_fp8(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
                  std::uint8_t* codes) override {
    cpu_fp8::encode(values, type, count, amax, format, codes);
  }
  void decode_fp8(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
                  DataType type) override {
    cpu_fp8::decode(codes, count, amax, format, values, type);
  }

  double sum_of_squares(const void* data, DataType type, std::size_t count) override {
    return with_element(type, [&](auto element) {
      using E = decltype(element);
      const auto* values = elements<E>(data);
      return lane_sum(count, [values](std::size_t i) {
        const double value = E::load(values[i]);
        return value * value;
      });
    });
  }

  void scale(void* data, DataType type, std::size_t count, float factor) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      auto* values = elements<E>(data);
      for (std::size_t i = 0; i < count; ++i) values[i] = E::store(E::load(values[i]) * factor);
    });
  }

  void fill(void* data, DataType type, std::size_t count, float value) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      std::fill(elements<E>(data), elements<E>(data) + count, E::store(value));
    });
  }

  void add(void* destination, const void* source, DataType type, std::size_t count) override {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      auto* __restrict out = elements<E>(destination);
      const auto* __restrict in = elements<E>(source);
      for (std::size_t i = 0; i < count; ++i) out[i] = E::store(E::load(out[i]) + E::load(in[i]));
    });
  }

 private:
  // grad_pre and the bias sums row by row, `after_row(row)` once a row of grad_pre is stored.
  template <typename AfterRow>
  void gelu_backward_rows(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                          DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols,
                          AfterRow after_row) {
    with_element(type, [&](auto element) {
      using E = decltype(element);
      column_sums_into(bias_grad, bias_grad_type, accumulate, rows, cols, [&](std::int64_t row, float* running) {
        const std::int64_t at = row * cols;
        if constexpr (std::is_same_v<E, Fp32>) {
          gelu_backward_row<E>(elements<E>(grad_activated) + at, elements<E>(pre) + at, elements<E>(grad_pre) + at,
                               running, cols);
        } else {
          gelu_backward_row<E>(elements<E>(grad_activated) + at, elements<E>(pre) + at, elements<E>(grad_pre) + at,
                               running, gelu_table<E>().derivative.data(), cols);
        }
        after_row(row);
      });
    });
  }

  template <typename E>
  const HalfGeluTable& gelu_table() const {
    return std::is_same_v<E, Bf16> ? bf16_gelu_ : fp16_gelu_;
  }

  OneDnnMatmul matmul_;
  // 384 KiB each, made in about 0.2 ms: cheaper to keep than to decide when to make.
  const HalfGeluTable bf16_gelu_ = make_half_gelu_table<Bf16>();
  const HalfGeluTable fp16_gelu_ = make_half_gelu_table<Fp16>();
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

int set_cpu_gemm_threads(int threads) {
  if (std::getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads(std::max(1, threads));
  return omp_get_max_threads();
}

}  // namespace mlptrain
