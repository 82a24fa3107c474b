// The kernel interface on a GPU (see kernels.hpp): cuBLAS for the GEMMs, and one kernel per op for
// the rest, all on the backend's compute stream. The numerics follow the CPU backend: GELU in its
// erf form, softmax and loss sums in double, AdamW's scalars formed in double as
// torch.optim.AdamW forms them. Two things differ by design: reductions over many elements sum
// per block in double and combine blocks with atomics (the order varies, the double sum does not
// visibly), and column sums run one thread per column over the rows in order, as the CPU does.
// (fmt's compile-time format strings do not build under nvcc: messages are plain strings.)
// Ops that return a value to the host (losses, AdamW's squared-gradient sum) synchronize the
// stream; the others only queue work.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace mlptrain {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("cuBLAS: ") + what + " failed (status " +
                         std::to_string(static_cast<int>(status)) + ")");
}

constexpr int block_threads = 256;

// Enough blocks to cover `count` elements with grid-stride loops, capped: more would only queue.
int blocks_for(std::int64_t count) {
  return static_cast<int>(std::clamp<std::int64_t>((count + block_threads - 1) / block_threads, 1, 8192));
}

__device__ float normal_cdf(float x) { return 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ float normal_pdf(float x) { return 0.39894228040143268f * expf(-0.5f * x * x); }

// The sum of every thread's `value` over the block, in shared memory; valid in thread 0. Every
// thread of the block must call it.
__device__ double block_sum(double value) {
  __shared__ double partial[block_threads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int half = block_threads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  return partial[0];
}

// Adds the block's sum of `value` into *total: one atomic per block.
__device__ void block_sum_into(double value, double* total) {
  const double sum = block_sum(value);
  if (threadIdx.x == 0) atomicAdd(total, sum);
}

#define GRID_STRIDE(index, count)                                                              \
  for (std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       index < (count); index += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void bias_gelu_forward_kernel(float* pre, const float* bias, float* activated,
                                         std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const float value = pre[i] + bias[i % cols];
    pre[i] = value;
    activated[i] = value * normal_cdf(value);
  }
}

__global__ void bias_add_kernel(float* data, const float* bias, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) data[i] += bias[i % cols];
}

__global__ void gelu_backward_kernel(const float* grad_activated, const float* pre, float* grad_pre,
                                     std::int64_t count) {
  GRID_STRIDE(i, count) {
    const float x = pre[i];
    grad_pre[i] = grad_activated[i] * (normal_cdf(x) + x * normal_pdf(x));
  }
}

// One thread per column, rows in order (coalesced: neighbouring threads read neighbouring columns).
__global__ void column_sums_kernel(const float* data, float* sums, bool accumulate, std::int64_t rows,
                                   std::int64_t cols) {
  GRID_STRIDE(col, cols) {
    float total = accumulate ? sums[col] : 0.0f;
    for (std::int64_t row = 0; row < rows; ++row) total += data[row * cols + col];
    sums[col] = total;
  }
}

__global__ void mse_kernel(const float* prediction, const float* target, float* grad, std::int64_t count,
                           float factor, double* total) {
  double sum = 0;
  GRID_STRIDE(i, count) {
    if (grad != nullptr) grad[i] = factor * (prediction[i] - target[i]);
    const double error = static_cast<double>(prediction[i]) - target[i];
    sum += error * error;
  }
  block_sum_into(sum, total);
}

// One thread per row: class counts are small. totals[0] += loss, totals[1] += correct rows.
__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* labels, float* grad,
                                     std::int64_t rows, std::int64_t cols, float grad_scale,
                                     double* totals) {
  double loss = 0, correct = 0;
  GRID_STRIDE(row, rows) {
    const float* row_logits = logits + row * cols;
    std::int64_t best = 0;
    for (std::int64_t col = 1; col < cols; ++col)
      if (row_logits[col] > row_logits[best]) best = col;  // ties keep the lower index
    const float largest = row_logits[best];
    double normalizer = 0;
    for (std::int64_t col = 0; col < cols; ++col) normalizer += exp(static_cast<double>(row_logits[col] - largest));
    const std::int32_t label = labels[row];
    loss += log(normalizer) - (row_logits[label] - largest);
    correct += best == label ? 1 : 0;
    if (grad != nullptr)
      for (std::int64_t col = 0; col < cols; ++col) {
        const double probability = exp(static_cast<double>(row_logits[col] - largest)) / normalizer;
        grad[row * cols + col] = grad_scale * static_cast<float>(probability - (col == label ? 1 : 0));
      }
  }
  block_sum_into(loss, &totals[0]);
  block_sum_into(correct, &totals[1]);
}

__global__ void softmax_rows_kernel(float* data, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(row, rows) {
    float* values = data + row * cols;
    float largest = values[0];
    for (std::int64_t col = 1; col < cols; ++col) largest = fmaxf(largest, values[col]);
    double total = 0;
    for (std::int64_t col = 0; col < cols; ++col) total += exp(static_cast<double>(values[col] - largest));
    for (std::int64_t col = 0; col < cols; ++col)
      values[col] = static_cast<float>(exp(static_cast<double>(values[col] - largest)) / total);
  }
}

__global__ void softmax_backward_rows_kernel(const float* probabilities, const float* grad_probabilities,
                                             float* grad_logits, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(row, rows) {
    const float* p = probabilities + row * cols;
    const float* g = grad_probabilities + row * cols;
    double inner = 0;
    for (std::int64_t col = 0; col < cols; ++col) inner += static_cast<double>(p[col]) * g[col];
    float* out = grad_logits + row * cols;  // may be grad_probabilities: each element read first
    for (std::int64_t col = 0; col < cols; ++col) out[col] = static_cast<float>(p[col] * (g[col] - inner));
  }
}

__global__ void gather_rows_kernel(const float* source, const std::int32_t* indices, const float* scales,
                                   float* destination, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const std::int64_t row = i / cols, col = i % cols;
    const float factor = scales != nullptr ? scales[row] : 1.0f;
    destination[i] = factor * source[static_cast<std::int64_t>(indices[row]) * cols + col];
  }
}

// One thread per column, rows in order: destination rows may repeat, and the CPU's order of
// additions is kept, so the sums agree bit for bit.
__global__ void scatter_add_rows_kernel(const float* source, const std::int32_t* indices, const float* scales,
                                        float* destination, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(col, cols) {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float factor = scales != nullptr ? scales[row] : 1.0f;
      destination[static_cast<std::int64_t>(indices[row]) * cols + col] += factor * source[row * cols + col];
    }
  }
}

// One block per row.
__global__ void row_dots_kernel(const float* a, const std::int32_t* indices, const float* b, float* dots,
                                std::int64_t cols) {
  const std::int64_t row = blockIdx.x;
  const float* left = a + static_cast<std::int64_t>(indices[row]) * cols;
  const float* right = b + row * cols;
  double sum = 0;
  for (std::int64_t col = threadIdx.x; col < cols; col += blockDim.x) sum += static_cast<double>(left[col]) * right[col];
  const double total = block_sum(sum);
  if (threadIdx.x == 0) dots[row] = static_cast<float>(total);
}

struct AdamWScalars {
  float step_size, correction2_sqrt, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
};

__global__ void adamw_kernel(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                             std::int64_t count, AdamWScalars s, double* squared_gradients) {
  double sum = 0;
  GRID_STRIDE(i, count) {
    const float gradient = grads[i];
    const float first = exp_avg[i] * s.beta1 + s.one_minus_beta1 * gradient;
    const float second = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * gradient * gradient;
    exp_avg[i] = first;
    exp_avg_sq[i] = second;
    const float denominator = sqrtf(second) / s.correction2_sqrt + s.eps;
    params[i] = params[i] * s.decay - s.step_size * (first / denominator);
    sum += static_cast<double>(gradient) * gradient;
  }
  block_sum_into(sum, squared_gradients);
}

__global__ void sum_of_squares_kernel(const float* data, std::int64_t count, double* total) {
  double sum = 0;
  GRID_STRIDE(i, count) sum += static_cast<double>(data[i]) * data[i];
  block_sum_into(sum, total);
}

__global__ void scale_kernel(float* data, std::int64_t count, float factor) {
  GRID_STRIDE(i, count) data[i] *= factor;
}

__global__ void fill_kernel(float* data, std::int64_t count, float value) {
  GRID_STRIDE(i, count) data[i] = value;
}

__global__ void add_kernel(float* destination, const float* source, std::int64_t count) {
  GRID_STRIDE(i, count) destination[i] += source[i];
}

class CudaKernels final : public Kernels {
 public:
  CudaKernels(int device, bool tf32) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, stream_), "cublasSetStream");
    // fp32 unless asked: results then compare with the CPU backend's.
    check(cublasSetMathMode(blas_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
    check(cudaMalloc(&totals_device_, 2 * sizeof(double)), "cudaMalloc");
    check(cudaMallocHost(&totals_host_, 2 * sizeof(double)), "cudaMallocHost");
  }
  ~CudaKernels() override {
    cudaStreamSynchronize(stream_);
    cudaFreeHost(totals_host_);
    cudaFree(totals_device_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  Device device() const override { return Device::cuda; }
  cudaStream_t stream() const { return stream_; }

  void gemm(Transpose transpose_a, Transpose transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
            float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
            float* c, std::int64_t ldc) override {
    if (m == 0 || n == 0) return;
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    const auto operation = [](Transpose t) { return t == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; };
    check(cublasSgemm(blas_, operation(transpose_b), operation(transpose_a), static_cast<int>(n),
                      static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a,
                      static_cast<int>(lda), &beta, c, static_cast<int>(ldc)),
          "cublasSgemm");
  }

  void bias_gelu_forward(float* pre, const float* bias, float* activated, std::int64_t rows,
                         std::int64_t cols) override {
    launch(bias_gelu_forward_kernel, rows * cols, pre, bias, activated, rows, cols);
  }
  void bias_add(float* data, const float* bias, std::int64_t rows, std::int64_t cols) override {
    launch(bias_add_kernel, rows * cols, data, bias, rows, cols);
  }
  void gelu_backward(const float* grad_activated, const float* pre, float* grad_pre, float* bias_grad,
                     bool accumulate, std::int64_t rows, std::int64_t cols) override {
    launch(gelu_backward_kernel, rows * cols, grad_activated, pre, grad_pre, rows * cols);
    column_sums(grad_pre, bias_grad, accumulate, rows, cols);
  }
  void column_sums(const float* data, float* sums, bool accumulate, std::int64_t rows,
                   std::int64_t cols) override {
    launch(column_sums_kernel, cols, data, sums, accumulate, rows, cols);
  }

  double mse(const float* prediction, const float* target, float* grad, std::int64_t rows,
             std::int64_t cols, float grad_scale) override {
    clear_totals();
    launch(mse_kernel, rows * cols, prediction, target, grad, rows * cols, 2.0f * grad_scale, totals_device_);
    return read_totals()[0];
  }
  CrossEntropyResult cross_entropy(const float* logits, const std::int32_t* labels, float* grad,
                                   std::int64_t rows, std::int64_t cols, float grad_scale) override {
    clear_totals();
    launch(cross_entropy_kernel, rows, logits, labels, grad, rows, cols, grad_scale, totals_device_);
    const double* totals = read_totals();
    return {.loss_sum = totals[0], .correct = std::llround(totals[1])};
  }

  void softmax_rows(float* data, std::int64_t rows, std::int64_t cols) override {
    launch(softmax_rows_kernel, rows, data, rows, cols);
  }
  void softmax_backward_rows(const float* probabilities, const float* grad_probabilities, float* grad_logits,
                             std::int64_t rows, std::int64_t cols) override {
    launch(softmax_backward_rows_kernel, rows, probabilities, grad_probabilities, grad_logits, rows, cols);
  }
  void gather_rows(const float* source, const std::int32_t* indices, const float* scales, float* destination,
                   std::int64_t rows, std::int64_t cols) override {
    launch(gather_rows_kernel, rows * cols, source, indices, scales, destination, rows, cols);
  }
  void scatter_add_rows(const float* source, const std::int32_t* indices, const float* scales,
                        float* destination, std::int64_t rows, std::int64_t cols) override {
    launch(scatter_add_rows_kernel, cols, source, indices, scales, destination, rows, cols);
  }
  void row_dots(const float* a, const std::int32_t* indices, const float* b, float* dots, std::int64_t rows,
                std::int64_t cols) override {
    if (rows == 0) return;
    row_dots_kernel<<<static_cast<unsigned>(rows), block_threads, 0, stream_>>>(a, indices, b, dots, cols);
    check(cudaGetLastError(), "row_dots launch");
  }

  double adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
               const AdamWStep& step) override {
    // The scalars are formed as torch.optim.AdamW forms them: in double, then used as float.
    const double correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
    const double correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
    const auto beta1 = static_cast<float>(step.beta1), beta2 = static_cast<float>(step.beta2);
    const AdamWScalars scalars{.step_size = static_cast<float>(step.learning_rate / correction1),
                               .correction2_sqrt = static_cast<float>(std::sqrt(correction2)),
                               .decay = static_cast<float>(1.0 - step.learning_rate * step.weight_decay),
                               .beta1 = beta1,
                               .beta2 = beta2,
                               .one_minus_beta1 = 1.0f - beta1,
                               .one_minus_beta2 = 1.0f - beta2,
                               .eps = static_cast<float>(step.eps)};
    clear_totals();
    launch(adamw_kernel, static_cast<std::int64_t>(count), params, grads, exp_avg, exp_avg_sq,
           static_cast<std::int64_t>(count), scalars, totals_device_);
    return read_totals()[0];
  }

  double sum_of_squares(const float* data, std::size_t count) override {
    clear_totals();
    launch(sum_of_squares_kernel, static_cast<std::int64_t>(count), data, static_cast<std::int64_t>(count),
           totals_device_);
    return read_totals()[0];
  }
  void scale(float* data, std::size_t count, float factor) override {
    launch(scale_kernel, static_cast<std::int64_t>(count), data, static_cast<std::int64_t>(count), factor);
  }
  void fill(float* data, std::size_t count, float value) override {
    launch(fill_kernel, static_cast<std::int64_t>(count), data, static_cast<std::int64_t>(count), value);
  }
  void copy(float* destination, const float* source, std::size_t count) override {
    if (count > 0)
      check(cudaMemcpyAsync(destination, source, count * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
  }
  void add(float* destination, const float* source, std::size_t count) override {
    launch(add_kernel, static_cast<std::int64_t>(count), destination, source, static_cast<std::int64_t>(count));
  }

 private:
  // Launches `kernel` over `count` work items (elements, rows or columns) on the compute stream.
  template <typename... Parameters, typename... Arguments>
  void launch(void (*kernel)(Parameters...), std::int64_t count, Arguments... arguments) {
    if (count <= 0) return;
    kernel<<<blocks_for(count), block_threads, 0, stream_>>>(arguments...);
    check(cudaGetLastError(), "kernel launch");
  }
  void clear_totals() { check(cudaMemsetAsync(totals_device_, 0, 2 * sizeof(double), stream_), "cudaMemsetAsync"); }
  const double* read_totals() {
    check(cudaMemcpyAsync(totals_host_, totals_device_, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return totals_host_;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  double* totals_device_ = nullptr;  // the reductions' sums
  double* totals_host_ = nullptr;    // pinned, for reading them back
};

}  // namespace

int cuda_device_count(std::string* why_none) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (why_none != nullptr) *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device is present";
  return count;
}

std::unique_ptr<Kernels> make_cuda_kernels(int device, bool tf32) {
  return std::make_unique<CudaKernels>(device, tf32);
}

void* cuda_compute_stream(Kernels& kernels) {
  auto* cuda = dynamic_cast<CudaKernels*>(&kernels);
  return cuda != nullptr ? static_cast<void*>(cuda->stream()) : nullptr;
}

}  // namespace mlptrain
