// The CUDA backend's fp8 casts (fp8_kernels.cu launches them): an operand's codes as it is, in
// packs where one scale covers it, and transposed (alone, or beside the codes as it is: a
// cast-transpose) through a shared-memory tile, so that both the reads of the operand and the
// writes of its codes run along memory, in packs where the shapes allow. Every element's scale
// comes from its scale's amax through fp8::scale_for, the one the CPU uses.
#pragma once

#include <algorithm>
#include <initializer_list>

#include "core/fp8.hpp"
#include "kernels/cuda/device_kernels.cuh"

namespace mlptrain {

namespace {

constexpr int tile = 32;       // the transposing tile's side, and the column tiles' width
constexpr int tile_rows = 8;   // rows of threads a tile's block walks it with

__device__ std::int64_t scale_index(Fp8Scaling scaling, std::int64_t row, std::int64_t col) {
  return scaling == Fp8Scaling::tensor ? 0 : scaling == Fp8Scaling::rows ? row : col;
}

template <typename E>
__device__ std::uint8_t operand_code(const Stored<E>* data, std::int64_t row, std::int64_t col, std::int64_t cols,
                                Fp8Scaling scaling, const float* amax, Fp8Format format) {
  const float scale = fp8::scale_for(amax[scale_index(scaling, row, col)], format);
  return fp8::code_of(E::load(data[row * cols + col]) * scale, format);
}

// V elements read as one aligned access, and their V codes written as one.
template <typename E, int V>
struct alignas(sizeof(Stored<E>) * V) ValuesPack {
  Stored<E> values[V];
};
template <int V>
struct alignas(V) CodesPack {
  std::uint8_t codes[V];
};
// Elements of E in a 16-byte pack.
template <typename E>
constexpr int values_per_pack = static_cast<int>(16 / sizeof(Stored<E>));

// One scale for the whole operand, read once a thread; packs of V elements.
template <typename E, int V>
__global__ void quantize_tensor_kernel(const Stored<E>* data, std::int64_t packs, const float* amax, Fp8Format format,
                                       std::uint8_t* codes) {
  const float scale = fp8::scale_for(amax[0], format);
  const auto* in = reinterpret_cast<const ValuesPack<E, V>*>(data);
  auto* out = reinterpret_cast<CodesPack<V>*>(codes);
  GRID_STRIDE(p, packs) {
    const ValuesPack<E, V> values = in[p];
    CodesPack<V> coded;
#pragma unroll
    for (int v = 0; v < V; ++v) coded.codes[v] = fp8::code_of(E::load(values.values[v]) * scale, format);
    out[p] = coded;
  }
}

template <typename E>
__global__ void quantize_kernel(const Stored<E>* data, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                                const float* amax, Fp8Format format, std::uint8_t* codes) {
  GRID_STRIDE(i, rows * cols) codes[i] = operand_code<E>(data, i / cols, i % cols, cols, scaling, amax, format);
}

// Codes of a tile of the operand, read once along its rows: `transposed_codes` [cols, rows]
// (scales of `transposed_scaling`) through shared memory, written out along the codes' rows, and,
// as a cast-transpose (`as_is_too`), `codes` [rows, cols] (scales of `scaling`) straight out.
// Tiles down the rows by grid stride (a grid's y is at most 65535 blocks).
template <typename E, bool as_is_too>
__global__ void quantize_tiles_kernel(const Stored<E>* data, std::int64_t rows, std::int64_t cols, Fp8Format format,
                                      Fp8Scaling transposed_scaling, const float* transposed_amax,
                                      std::uint8_t* transposed_codes, Fp8Scaling scaling, const float* amax,
                                      std::uint8_t* codes) {
  __shared__ std::uint8_t block[tile][tile + 4];
  const std::int64_t first_col = static_cast<std::int64_t>(blockIdx.x) * tile;
  for (std::int64_t first_row = static_cast<std::int64_t>(blockIdx.y) * tile; first_row < rows;
       first_row += static_cast<std::int64_t>(gridDim.y) * tile) {
    for (int line = threadIdx.y; line < tile; line += tile_rows) {
      const std::int64_t row = first_row + line, col = first_col + threadIdx.x;
      if (row < rows && col < cols) {
        const float value = E::load(data[row * cols + col]);
        const float scale = fp8::scale_for(transposed_amax[scale_index(transposed_scaling, row, col)], format);
        block[line][threadIdx.x] = fp8::code_of(value * scale, format);
        if constexpr (as_is_too)
          codes[row * cols + col] =
              fp8::code_of(value * fp8::scale_for(amax[scale_index(scaling, row, col)], format), format);
      }
    }
    __syncthreads();
    for (int line = threadIdx.y; line < tile; line += tile_rows) {
      const std::int64_t col = first_col + line, row = first_row + threadIdx.x;
      if (row < rows && col < cols) transposed_codes[col * rows + row] = block[threadIdx.x][line];
    }
    __syncthreads();
  }
}

// quantize_tiles_kernel in packs, for a 16-bit operand whose rows and columns are multiples of 8
// (packs_fit_codes): tiles of 64 x 64, each thread reading 8 elements of a row as one 16-byte
// access and writing 8 codes as one 8-byte access, as_is along the row, transposed along a
// column of the tile in shared memory. The same codes as quantize_tiles_kernel.
constexpr int packed_tile = 64, packed_values = 8, packed_lanes = packed_tile / packed_values;
constexpr int packed_tile_rows = block_threads / packed_lanes;  // rows of a tile a pass covers

template <typename E, bool as_is_too>
__global__ void quantize_tiles_packed_kernel(const Stored<E>* data, std::int64_t rows, std::int64_t cols,
                                             Fp8Format format, Fp8Scaling transposed_scaling,
                                             const float* transposed_amax, std::uint8_t* transposed_codes,
                                             Fp8Scaling scaling, const float* amax, std::uint8_t* codes) {
  __shared__ alignas(16) std::uint8_t block[packed_tile][packed_tile + packed_values];  // [column][row] of the tile
  const float transposed_tensor_scale =
      transposed_scaling == Fp8Scaling::tensor ? fp8::scale_for(transposed_amax[0], format) : 0.0f;
  const float tensor_scale = as_is_too && scaling == Fp8Scaling::tensor ? fp8::scale_for(amax[0], format) : 0.0f;
  const int lane = threadIdx.x % packed_lanes, line = threadIdx.x / packed_lanes;
  const std::int64_t first_col = static_cast<std::int64_t>(blockIdx.x) * packed_tile;
  for (std::int64_t first_row = static_cast<std::int64_t>(blockIdx.y) * packed_tile; first_row < rows;
       first_row += static_cast<std::int64_t>(gridDim.y) * packed_tile) {
    for (int tile_row = line; tile_row < packed_tile; tile_row += packed_tile_rows) {
      const std::int64_t row = first_row + tile_row, col = first_col + lane * packed_values;
      if (row >= rows || col >= cols) continue;
      const auto values = *reinterpret_cast<const ValuesPack<E, packed_values>*>(data + row * cols + col);
      CodesPack<packed_values> coded;
#pragma unroll
      for (int v = 0; v < packed_values; ++v) {
        const float value = E::load(values.values[v]);
        const float transposed_scale =
            transposed_scaling == Fp8Scaling::tensor
                ? transposed_tensor_scale
                : fp8::scale_for(transposed_amax[scale_index(transposed_scaling, row, col + v)], format);
        block[lane * packed_values + v][tile_row] = fp8::code_of(value * transposed_scale, format);
        if constexpr (as_is_too) {
          const float scale = scaling == Fp8Scaling::tensor
                                  ? tensor_scale
                                  : fp8::scale_for(amax[scale_index(scaling, row, col + v)], format);
          coded.codes[v] = fp8::code_of(value * scale, format);
        }
      }
      if constexpr (as_is_too) *reinterpret_cast<CodesPack<packed_values>*>(codes + row * cols + col) = coded;
    }
    __syncthreads();
    // A column of the tile is a row of the transposed codes: 8 of its rows a thread.
    for (int tile_col = line; tile_col < packed_tile; tile_col += packed_tile_rows) {
      const std::int64_t col = first_col + tile_col, row = first_row + lane * packed_values;
      if (row >= rows || col >= cols) continue;
      *reinterpret_cast<CodesPack<packed_values>*>(transposed_codes + col * rows + row) =
          *reinterpret_cast<const CodesPack<packed_values>*>(&block[tile_col][lane * packed_values]);
    }
    __syncthreads();
  }
}

// Whether an operand's tiles run in packs: 16-bit values, rows and columns multiples of 8, the
// values 16-byte and the codes 8-byte aligned.
bool packs_fit_codes(std::size_t value_bytes, std::int64_t rows, std::int64_t cols, const void* data,
                     std::initializer_list<const std::uint8_t*> codes) {
  if (value_bytes != 2 || rows % packed_values != 0 || cols % packed_values != 0) return false;
  if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0) return false;
  for (const std::uint8_t* out : codes)
    if (out != nullptr && reinterpret_cast<std::uintptr_t>(out) % packed_values != 0) return false;
  return true;
}

// The tiles' grid over an operand [rows, cols].
dim3 tile_grid(std::int64_t rows, std::int64_t cols, int side = tile) {
  return dim3(static_cast<unsigned>((cols + side - 1) / side),
              static_cast<unsigned>(std::min<std::int64_t>((rows + side - 1) / side, 65535)));
}

// The codes of quantize_tiles_kernel, in packs where they fit.
template <typename E, bool as_is_too>
void launch_tiles(cudaStream_t stream, const Stored<E>* data, std::int64_t rows, std::int64_t cols, Fp8Format format,
                  Fp8Scaling transposed_scaling, const float* transposed_amax, std::uint8_t* transposed_codes,
                  Fp8Scaling scaling, const float* amax, std::uint8_t* codes) {
  if (packs_fit_codes(sizeof(Stored<E>), rows, cols, data, {transposed_codes, codes}))
    quantize_tiles_packed_kernel<E, as_is_too><<<tile_grid(rows, cols, packed_tile), block_threads, 0, stream>>>(
        data, rows, cols, format, transposed_scaling, transposed_amax, transposed_codes, scaling, amax, codes);
  else
    quantize_tiles_kernel<E, as_is_too><<<tile_grid(rows, cols), dim3(tile, tile_rows), 0, stream>>>(
        data, rows, cols, format, transposed_scaling, transposed_amax, transposed_codes, scaling, amax, codes);
}

}  // namespace

}  // namespace mlptrain
