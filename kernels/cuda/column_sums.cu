// The two-stage column sums (see column_sums.hpp).
#include "kernels/cuda/column_sums.hpp"

#include <algorithm>

#include "kernels/cuda/layer_kernels.cuh"

namespace mlptrain {

namespace {

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
                                       std::int64_t rows_per_block, std::uint32_t* amax_bits) {
  const std::int64_t packs_per_row = cols / V;
  const std::int64_t pack = blockIdx.x * static_cast<std::int64_t>(column_tile_packs) + threadIdx.x;
  const std::int64_t first_row = blockIdx.y * rows_per_block;
  const std::int64_t end_row = min(rows, first_row + rows_per_block);
  float sums[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sums[v] = 0.0f;
  std::uint32_t largest = 0;
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
          largest = max(largest, magnitude_bits(E::load(gradient.values[v])));
        }
        out[at] = gradient;
      } else {
#pragma unroll
        for (int v = 0; v < V; ++v) sums[v] += E::load(upstream.values[v]);
      }
    }
  }
  // A warp is one row lane of the tile (blockDim.x is a warp): every lane reaches this.
  if (gelu && amax_bits != nullptr) warp_amax(largest, amax_bits);
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

void ColumnSums::run(const ColumnSumsCall& call) const {
  const std::int64_t rows = call.rows, cols = call.cols;
  if (cols <= 0) return;
  with_device_element(call.type, [&](auto element) {
    using E = decltype(element);
    constexpr int V = pack_width<E>;
    const bool gelu = call.pre != nullptr;
    const bool packed = cols % V == 0 && packs_fit({call.data, call.pre, call.grad_pre}, cols, V);
    const std::int64_t width = packed ? V : 1;
    const std::int64_t tiles = (cols / width + column_tile_packs - 1) / column_tile_packs;
    const std::int64_t wanted_blocks = 4 * static_cast<std::int64_t>(multiprocessors);
    const std::int64_t most_row_blocks = std::max<std::int64_t>(1, (rows + row_lanes - 1) / row_lanes);
    std::int64_t row_blocks =
        std::clamp<std::int64_t>((wanted_blocks + tiles - 1) / tiles, 1, std::min<std::int64_t>(most_row_blocks, 65535));
    // Whole row lanes a block, and no block without rows.
    const std::int64_t rows_per_block =
        std::max<std::int64_t>(row_lanes, ((rows + row_blocks - 1) / row_blocks + row_lanes - 1) / row_lanes * row_lanes);
    row_blocks = std::max<std::int64_t>(1, (rows + rows_per_block - 1) / rows_per_block);
    auto* partials = static_cast<float*>(scratch.reserve(static_cast<std::size_t>(row_blocks * cols) * sizeof(float)));
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(row_blocks));
    const dim3 block(column_tile_packs, row_lanes);
    auto* amax_bits = reinterpret_cast<std::uint32_t*>(call.amax);
    if (amax_bits != nullptr) check(cudaMemsetAsync(amax_bits, 0, sizeof(float), stream), "cudaMemsetAsync");
    const auto* in = static_cast<const Stored<E>*>(call.data);
    const auto* saved = static_cast<const Stored<E>*>(call.pre);
    auto* out = static_cast<Stored<E>*>(call.grad_pre);
    if (packed && gelu)
      column_partials_kernel<E, V, true><<<grid, block, 0, stream>>>(in, saved, out, partials, rows, cols, rows_per_block, amax_bits);
    else if (packed)
      column_partials_kernel<E, V, false><<<grid, block, 0, stream>>>(in, saved, out, partials, rows, cols, rows_per_block, amax_bits);
    else if (gelu)
      column_partials_kernel<E, 1, true><<<grid, block, 0, stream>>>(in, saved, out, partials, rows, cols, rows_per_block, amax_bits);
    else
      column_partials_kernel<E, 1, false><<<grid, block, 0, stream>>>(in, saved, out, partials, rows, cols, rows_per_block, amax_bits);
    check(cudaGetLastError(), "column_partials_kernel launch");
    with_device_element(call.sums_type, [&](auto sums_element) {
      using S = decltype(sums_element);
      column_totals_kernel<S><<<blocks_for(cols), block_threads, 0, stream>>>(
          static_cast<const float*>(partials), row_blocks, static_cast<Stored<S>*>(call.sums), call.accumulate, cols);
      check(cudaGetLastError(), "column_totals_kernel launch");
    });
  });
}

}  // namespace mlptrain
