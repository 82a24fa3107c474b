// The CUDA backend's kernels around a Linear layer's GEMMs (see cuda_kernels.cu, their includer):
// GELU forward and backward, the bias where no GEMM epilogue adds it, and column sums (the bias
// gradient). Each is a pass over memory, so each moves its elements in packs of 16 bytes (8 bf16
// or fp16, 4 fp32) where the pointers and sizes allow, one element at a time otherwise. Column
// sums run in two stages at HBM speed: blocks of rows sum their tiles' columns into fp32
// partials, then one thread per column adds its partials in block order; GELU's backward writes
// its gradient and the partials of its column sums in the same pass.
#pragma once

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

// GELU of the pre-activation as stored, `packs` packs of V elements.
template <typename E, int V>
__global__ void gelu_forward_kernel(const Stored<E>* pre, Stored<E>* activated, std::int64_t packs) {
  const auto* in = reinterpret_cast<const Pack<E, V>*>(pre);
  auto* out = reinterpret_cast<Pack<E, V>*>(activated);
  GRID_STRIDE(p, packs) {
    const Pack<E, V> x = in[p];
    Pack<E, V> y;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float value = E::load(x.values[v]);
      y.values[v] = E::store(value * normal_cdf(value));
    }
    out[p] = y;
  }
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

// The column tiles of the first stage: a block is column_tile_packs packs wide (a warp, reading
// consecutive packs of a row) and row_lanes rows deep, walking its block of rows.
constexpr int column_tile_packs = 32;
constexpr int row_lanes = 8;

// Stage one: partials[block_row, c] = the fp32 sum of column c over this block's rows, of `data`
// as stored, or with `gelu` of grad_pre = round(data * GELU'(pre)), which it also stores (the
// rounded values are the ones summed, as the CPU sums them).
template <typename E, int V, bool gelu>
__global__ void column_partials_kernel(const Stored<E>* data, const Stored<E>* pre, Stored<E>* grad_pre,
                                       float* partials, std::int64_t rows, std::int64_t cols,
                                       std::int64_t rows_per_block) {
  const std::int64_t packs_per_row = cols / V;
  const std::int64_t pack = blockIdx.x * static_cast<std::int64_t>(column_tile_packs) + threadIdx.x;
  const std::int64_t first_row = blockIdx.y * rows_per_block;
  const std::int64_t end_row = min(rows, first_row + rows_per_block);
  float sums[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sums[v] = 0.0f;
  if (pack < packs_per_row) {
    const auto* in = reinterpret_cast<const Pack<E, V>*>(data);
    const auto* saved = reinterpret_cast<const Pack<E, V>*>(pre);
    auto* out = reinterpret_cast<Pack<E, V>*>(grad_pre);
#pragma unroll 4
    for (std::int64_t row = first_row + threadIdx.y; row < end_row; row += row_lanes) {
      const std::int64_t at = row * packs_per_row + pack;
      const Pack<E, V> upstream = in[at];
      if constexpr (gelu) {
        const Pack<E, V> x = saved[at];
        Pack<E, V> gradient;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          gradient.values[v] = E::store(E::load(upstream.values[v]) * gelu_slope(E::load(x.values[v])));
          sums[v] += E::load(gradient.values[v]);
        }
        out[at] = gradient;
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) sums[v] += E::load(upstream.values[v]);
      }
    }
  }
  __shared__ float lanes[row_lanes][column_tile_packs * V];
#pragma unroll
  for (int v = 0; v < V; ++v) lanes[threadIdx.y][threadIdx.x * V + v] = sums[v];
  __syncthreads();
  if (threadIdx.y != 0 || pack >= packs_per_row) return;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float total = lanes[0][threadIdx.x * V + v];
    for (int lane = 1; lane < row_lanes; ++lane) total += lanes[lane][threadIdx.x * V + v];
    partials[blockIdx.y * cols + pack * V + v] = total;
  }
}

// Stage two: sums[c] = (or +=) the partials of column c added in block order, in fp32, rounded
// once into the sums' type.
template <typename S>
__global__ void column_totals_kernel(const float* partials, std::int64_t row_blocks, Stored<S>* sums, bool accumulate,
                                     std::int64_t cols) {
  GRID_STRIDE(col, cols) {
    float total = 0.0f;
    for (std::int64_t block = 0; block < row_blocks; ++block) total += partials[block * cols + col];
    sums[col] = S::store(accumulate ? S::load(sums[col]) + total : total);
  }
}

}  // namespace

}  // namespace mlptrain
