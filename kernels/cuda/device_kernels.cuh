// The CUDA backend's device code (cuda_kernels.cu's; fp8_kernels.cu and the layer kernels use its
// helpers): one kernel per op of the kernel interface besides the GEMMs, with grid-stride loops
// and per-block sums in double, written once for every element type (fp32, bf16, fp16: widened
// to fp32 to compute, results rounded once to nearest even, as the CPU does).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "core/data_type.hpp"

namespace mlptrain {

namespace {

struct DeviceFp32 {
  using Storage = float;
  __device__ static float load(float value) { return value; }
  __device__ static float store(float value) { return value; }
};
struct DeviceBf16 {
  using Storage = __nv_bfloat16;
  __device__ static float load(__nv_bfloat16 value) { return __bfloat162float(value); }
  __device__ static __nv_bfloat16 store(float value) { return __float2bfloat16_rn(value); }
};
struct DeviceFp16 {
  using Storage = __half;
  __device__ static float load(__half value) { return __half2float(value); }
  __device__ static __half store(float value) { return __float2half_rn(value); }
};

// Calls body(Element{}) for the device traits of `type` (one of the training types).
template <typename Body>
decltype(auto) with_device_element(DataType type, Body&& body) {
  switch (type) {
    case DataType::float32: return body(DeviceFp32{});
    case DataType::bfloat16: return body(DeviceBf16{});
    case DataType::float16: return body(DeviceFp16{});
    default: throw std::logic_error("the CUDA kernels compute on fp32, bf16 and fp16 only");
  }
}

template <typename Element>
using Stored = typename Element::Storage;
constexpr int block_threads = 256;

// Enough blocks to cover `count` elements with grid-stride loops, capped: more would only queue.
int blocks_for(std::int64_t count) {
  return static_cast<int>(std::clamp<std::int64_t>((count + block_threads - 1) / block_threads, 1, 8192));
}

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

// |value|'s bits: non-negative floats (NaN's above infinity's) order as their bits, so maxima
// (fp8's amax) combine with atomicMax on them.
__device__ std::uint32_t magnitude_bits(float value) { return __float_as_uint(value) & 0x7fffffffu; }

// The warp's largest magnitude bits into *amax_bits, one atomic a warp (every lane of a whole
// warp must call it; *amax_bits starts at 0).
__device__ void warp_amax(std::uint32_t largest, std::uint32_t* amax_bits) {
  largest = __reduce_max_sync(0xffffffffu, largest);
  if (threadIdx.x % 32 == 0 && largest > 0) atomicMax(amax_bits, largest);
}

#define GRID_STRIDE(index, count)                                                              \
  for (std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; \
       index < (count); index += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

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

template <typename E>
__global__ void gather_rows_kernel(const Stored<E>* source, const std::int32_t* indices, const float* scales,
                                   Stored<E>* destination, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const std::int64_t row = i / cols, col = i % cols;
    const float factor = scales != nullptr ? scales[row] : 1.0f;
    destination[i] = E::store(factor * E::load(source[static_cast<std::int64_t>(indices[row]) * cols + col]));
  }
}

// One thread per element of a token's row, adding its rows in list order by FMAs, as the CPU does.
template <typename S, typename D>
__global__ void sum_token_rows_kernel(const Stored<S>* source, const std::int32_t* row_begin, const std::int32_t* rows,
                                      const float* scales, Stored<D>* destination, std::int64_t tokens,
                                      std::int64_t cols) {
  GRID_STRIDE(i, tokens * cols) {
    const std::int64_t token = i / cols, col = i % cols;
    float sum = 0.0f;
    for (std::int32_t entry = row_begin[token]; entry < row_begin[token + 1]; ++entry) {
      const std::int64_t row = rows[entry];
      const float factor = scales != nullptr ? scales[row] : 1.0f, value = S::load(source[row * cols + col]);
      sum = entry == row_begin[token] ? __fmul_rn(factor, value) : fmaf(factor, value, sum);
    }
    destination[i] = D::store(sum);
  }
}

// One block per row.
template <typename E>
__global__ void row_dots_kernel(const Stored<E>* a, const std::int32_t* indices, const Stored<E>* b, float* dots,
                                std::int64_t cols) {
  const std::int64_t row = blockIdx.x;
  const Stored<E>* left = a + static_cast<std::int64_t>(indices[row]) * cols;
  const Stored<E>* right = b + row * cols;
  double sum = 0;
  for (std::int64_t col = threadIdx.x; col < cols; col += blockDim.x)
    sum += static_cast<double>(E::load(left[col])) * E::load(right[col]);
  const double total = block_sum(sum);
  if (threadIdx.x == 0) dots[row] = static_cast<float>(total);
}

struct AdamWScalars {
  float step_size, inverse_correction2_sqrt, decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale;
};

// Several ranges of AdamW's flat state updated by one launch (the ranges of a step's
// parameters: one per layer or shard), passed by value: as many as fit a launch's parameters.
constexpr int adamw_ranges_per_launch = 40;
struct AdamWRangeTable {
  struct Range {
    float* master;
    const void* grads;
    float* exp_avg;
    float* exp_avg_sq;
    void* compute_copy;  // the updated weights rounded to the compute type, or null
  } ranges[adamw_ranges_per_launch];
  std::int64_t ends[adamw_ranges_per_launch];  // where each range ends in the ranges laid end to end
  std::uint64_t counted;                       // bit r: range r's gradients count in the sum
  int count;
};

// AdamW over the table's ranges as one index space, each element as the CPU updates it; the
// squared (scaled) gradients of the counted ranges summed in double.
template <typename G, typename C>
__global__ void adamw_kernel(AdamWRangeTable table, AdamWScalars s, double* squared_gradients) {
  double sum = 0;
  GRID_STRIDE(index, table.ends[table.count - 1]) {
    int range = 0;
    while (index >= table.ends[range]) ++range;
    const auto& r = table.ranges[range];
    const std::int64_t i = index - (range == 0 ? 0 : table.ends[range - 1]);
    const auto* grads = static_cast<const Stored<G>*>(r.grads);
    const float gradient = s.grad_scale == 1.0f ? G::load(grads[i]) : G::load(grads[i]) * s.grad_scale;
    const float first = r.exp_avg[i] * s.beta1 + s.one_minus_beta1 * gradient;
    const float second = r.exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * gradient * gradient;
    r.exp_avg[i] = first;
    r.exp_avg_sq[i] = second;
    const float denominator = sqrtf(second) * s.inverse_correction2_sqrt + s.eps;
    const float updated = r.master[i] * s.decay - s.step_size * (first / denominator);
    r.master[i] = updated;
    if (r.compute_copy != nullptr) static_cast<Stored<C>*>(r.compute_copy)[i] = C::store(updated);
    if ((table.counted >> range) & 1u) sum += static_cast<double>(gradient) * gradient;
  }
  block_sum_into(sum, squared_gradients);
}

template <typename E>
__global__ void sum_of_squares_kernel(const Stored<E>* data, std::int64_t count, double* total) {
  double sum = 0;
  GRID_STRIDE(i, count) {
    const double value = E::load(data[i]);
    sum += value * value;
  }
  block_sum_into(sum, total);
}

template <typename E>
__global__ void scale_kernel(Stored<E>* data, std::int64_t count, float factor) {
  GRID_STRIDE(i, count) data[i] = E::store(E::load(data[i]) * factor);
}

template <typename E>
__global__ void fill_kernel(Stored<E>* data, std::int64_t count, float value) {
  GRID_STRIDE(i, count) data[i] = E::store(value);
}

template <typename E>
__global__ void add_kernel(Stored<E>* destination, const Stored<E>* source, std::int64_t count) {
  GRID_STRIDE(i, count) destination[i] = E::store(E::load(destination[i]) + E::load(source[i]));
}

// With `takes_amax`, also the largest |destination| as stored into *amax_bits.
template <typename In, typename Out, bool takes_amax>
__global__ void convert_kernel(const Stored<In>* source, Stored<Out>* destination, std::int64_t count,
                               std::uint32_t* amax_bits) {
  std::uint32_t largest = 0;
  GRID_STRIDE(i, count) {
    destination[i] = Out::store(In::load(source[i]));
    if constexpr (takes_amax) largest = max(largest, magnitude_bits(Out::load(destination[i])));
  }
  if constexpr (takes_amax) warp_amax(largest, amax_bits);
}

}  // namespace

}  // namespace mlptrain
