// The CUDA backend's kernels around a Linear layer's GEMMs (cuda_kernels.cu and column_sums.cu
// include them): GELU forward and its derivative, the bias where no GEMM epilogue adds it. Each is
// a pass over memory, so each moves its elements in packs of 16 bytes (8 bf16 or fp16, 4 fp32)
// where the pointers and sizes allow, one element at a time otherwise.
#pragma once

#include <initializer_list>

#include "kernels/cuda/device_kernels.cuh"

namespace mlptrain {

namespace {

// V stored elements moved as one aligned access.
template <typename E, int V>
struct alignas(sizeof(Stored<E>) * V) Pack {
  Stored<E> values[V];
};

// Elements of E in a 16-byte pack.
template <typename E>
constexpr int pack_width = static_cast<int>(16 / sizeof(Stored<E>));

__device__ float normal_cdf(float x) { return 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ float normal_pdf(float x) { return 0.39894228040143268f * expf(-0.5f * x * x); }
// GELU's derivative: Phi(x) + x phi(x).
__device__ float gelu_slope(float x) { return normal_cdf(x) + x * normal_pdf(x); }

// GELU of the pre-activation as stored, `packs` packs of V elements; with `takes_amax`, also the
// largest |output| as stored into *amax_bits (an fp8 operand's amax where it is made).
template <typename E, int V, bool takes_amax>
__global__ void gelu_forward_kernel(const Stored<E>* pre, Stored<E>* activated, std::int64_t packs,
                                    std::uint32_t* amax_bits) {
  const auto* in = reinterpret_cast<const Pack<E, V>*>(pre);
  auto* out = reinterpret_cast<Pack<E, V>*>(activated);
  std::uint32_t largest = 0;
  GRID_STRIDE(p, packs) {
    const Pack<E, V> x = in[p];
    Pack<E, V> y;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float value = E::load(x.values[v]);
      y.values[v] = E::store(value * normal_cdf(value));
      if constexpr (takes_amax) largest = max(largest, magnitude_bits(E::load(y.values[v])));
    }
    out[p] = y;
  }
  if constexpr (takes_amax) warp_amax(largest, amax_bits);
}

// c[r, j] = (sums[r, j] + bias[j]) added in fp32 and rounded once into c's type: a biased GEMM
// whose bias no epilogue added.
template <typename B, typename Out>
__global__ void bias_round_kernel(const float* sums, std::int64_t sums_leading, const Stored<B>* bias, Stored<Out>* c,
                                  std::int64_t c_leading, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const std::int64_t row = i / cols, col = i % cols;
    c[row * c_leading + col] = Out::store(sums[row * sums_leading + col] + B::load(bias[col]));
  }
}

template <typename E>
__global__ void bias_add_kernel(Stored<E>* data, const Stored<E>* bias, std::int64_t rows, std::int64_t cols) {
  GRID_STRIDE(i, rows * cols) data[i] = E::store(E::load(data[i]) + E::load(bias[i % cols]));
}

// Whether `count` elements at each pointer move in packs of `width` (16-byte aligned, whole packs).
inline bool packs_fit(std::initializer_list<const void*> pointers, std::int64_t count, int width) {
  if (count % width != 0) return false;
  for (const void* pointer : pointers)
    if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) return false;
  return true;
}

}  // namespace

}  // namespace mlptrain
