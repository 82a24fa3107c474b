// The CUDA backend's fp8 ops (see fp8_kernels.hpp). Maxima compare magnitudes as their bits,
// which order non-negative floats as their values do, so blocks combine them with atomicMax on
// the bits; every element's scale comes from its scale's amax through fp8::scale_for, the one
// the CPU uses. The transposed codes go through a shared-memory tile, so that both the reads of
// the operand and the writes of its codes run along memory.
#include "kernels/cuda/fp8_kernels.hpp"

#include <algorithm>
#include <initializer_list>

#include "core/fp8.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_kernels.cuh"

namespace mlptrain {

namespace {

constexpr int warp_size = 32;
constexpr int tile = 32;       // the transposing tile's side, and the column tiles' width
constexpr int tile_rows = 8;   // rows of threads a tile's block walks it with

__device__ std::int64_t scale_index(Fp8Scaling scaling, std::int64_t row, std::int64_t col) {
  return scaling == Fp8Scaling::tensor ? 0 : scaling == Fp8Scaling::rows ? row : col;
}

// The largest magnitude over the whole operand.
template <typename E>
__global__ void tensor_amax_kernel(const Stored<E>* data, std::int64_t count, std::uint32_t* amax_bits) {
  std::uint32_t largest = 0;
  GRID_STRIDE(i, count) largest = max(largest, magnitude_bits(E::load(data[i])));
  warp_amax(largest, amax_bits);
}

// One block a row.
template <typename E>
__global__ void row_amax_kernel(const Stored<E>* data, std::int64_t cols, float* amax) {
  __shared__ std::uint32_t warp_largest[block_threads / warp_size];
  const Stored<E>* row = data + static_cast<std::int64_t>(blockIdx.x) * cols;
  std::uint32_t largest = 0;
  for (std::int64_t col = threadIdx.x; col < cols; col += blockDim.x)
    largest = max(largest, magnitude_bits(E::load(row[col])));
  largest = __reduce_max_sync(0xffffffffu, largest);
  if (threadIdx.x % warp_size == 0) warp_largest[threadIdx.x / warp_size] = largest;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int warp = 1; warp < block_threads / warp_size; ++warp) largest = max(largest, warp_largest[warp]);
    amax[blockIdx.x] = __uint_as_float(largest);
  }
}

// Blocks of `tile` columns by `tile_rows` rows of threads, each walking its column down a share
// of the rows; the block's rows combined in shared memory, one atomic a column and block.
template <typename E>
__global__ void column_amax_kernel(const Stored<E>* data, std::int64_t rows, std::int64_t cols,
                                   std::uint32_t* amax_bits) {
  __shared__ std::uint32_t partial[tile_rows][tile];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * tile + threadIdx.x;
  std::uint32_t largest = 0;
  if (col < cols)
    for (std::int64_t row = static_cast<std::int64_t>(blockIdx.y) * tile_rows + threadIdx.y; row < rows;
         row += static_cast<std::int64_t>(gridDim.y) * tile_rows)
      largest = max(largest, magnitude_bits(E::load(data[row * cols + col])));
  partial[threadIdx.y][threadIdx.x] = largest;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int lane = 1; lane < tile_rows; ++lane) largest = max(largest, partial[lane][threadIdx.x]);
    if (largest > 0) atomicMax(amax_bits + col, largest);
  }
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

__global__ void inverse_scales_kernel(const float* amax, std::int64_t count, Fp8Format format, float* inverse) {
  GRID_STRIDE(i, count) inverse[i] = 1.0f / fp8::scale_for(amax[i], format);
}

// values = decode(codes) / s, s from the one amax (ZeRO-3's gathered weights); the emulation's
// operands take amax = null: their values unscaled.
template <typename E>
__global__ void decode_kernel(const std::uint8_t* codes, std::int64_t count, const float* amax, Fp8Format format,
                              Stored<E>* values) {
  const float inverse = amax != nullptr ? 1.0f / fp8::scale_for(*amax, format) : 1.0f;
  GRID_STRIDE(i, count) values[i] = E::store(fp8::decode(codes[i], format) * inverse);
}

// c = sums x a's inverse scale x b's (+ bias) (+ c), in the CPU's order: the bias (or +0) first.
template <typename E>
__global__ void unscale_kernel(const float* sums, std::int64_t m, std::int64_t n, const float* a_inverse,
                               bool a_per_row, const float* b_inverse, bool b_per_row, const Stored<E>* bias,
                               Stored<E>* c, bool accumulate) {
  GRID_STRIDE(i, m * n) {
    const std::int64_t row = i / n, col = i % n;
    float value = __fmul_rn(__fmul_rn(sums[i], a_inverse[a_per_row ? row : 0]), b_inverse[b_per_row ? col : 0]);
    value = __fadd_rn(value, bias != nullptr ? E::load(bias[col]) : 0.0f);
    if (accumulate) value = __fadd_rn(value, E::load(c[i]));
    c[i] = E::store(value);
  }
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void CudaFp8::absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols,
                           Fp8Scaling scaling, float* amax) {
  const std::int64_t count = fp8_scale_count(scaling, rows, cols);
  if (rows * cols == 0) {
    check(cudaMemsetAsync(amax, 0, static_cast<std::size_t>(count) * sizeof(float), stream_), "cudaMemsetAsync");
    return;
  }
  with_device_element(type, [&](auto element) {
    using E = decltype(element);
    const auto* in = static_cast<const Stored<E>*>(data);
    auto* bits = reinterpret_cast<std::uint32_t*>(amax);
    switch (scaling) {
      case Fp8Scaling::tensor:
        check(cudaMemsetAsync(amax, 0, sizeof(float), stream_), "cudaMemsetAsync");
        tensor_amax_kernel<E><<<blocks_for(rows * cols), block_threads, 0, stream_>>>(in, rows * cols, bits);
        break;
      case Fp8Scaling::rows:
        row_amax_kernel<E><<<static_cast<unsigned>(rows), block_threads, 0, stream_>>>(in, cols, amax);
        break;
      case Fp8Scaling::columns: {
        check(cudaMemsetAsync(amax, 0, static_cast<std::size_t>(cols) * sizeof(float), stream_), "cudaMemsetAsync");
        const dim3 grid(static_cast<unsigned>((cols + tile - 1) / tile),
                        static_cast<unsigned>(std::min<std::int64_t>((rows + tile_rows - 1) / tile_rows, 64)));
        column_amax_kernel<E><<<grid, dim3(tile, tile_rows), 0, stream_>>>(in, rows, cols, bits);
        break;
      }
    }
  });
  check_launch("fp8 amax");
}

void CudaFp8::quantize(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                       const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes,
                       float* inverse_scales) {
  const std::int64_t count = fp8_scale_count(scaling, rows, cols);
  inverse_scales_kernel<<<blocks_for(count), block_threads, 0, stream_>>>(amax, count, format, inverse_scales);
  if (rows * cols > 0) {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      const auto* in = static_cast<const Stored<E>*>(data);
      constexpr int V = values_per_pack<E>;
      const std::int64_t count = rows * cols;
      const bool packed = count % V == 0 && reinterpret_cast<std::uintptr_t>(data) % 16 == 0 &&
                          reinterpret_cast<std::uintptr_t>(codes) % V == 0;
      if (layout == Fp8CodeLayout::as_is && scaling == Fp8Scaling::tensor && packed) {
        quantize_tensor_kernel<E, V><<<blocks_for(count / V), block_threads, 0, stream_>>>(in, count / V, amax, format,
                                                                                         codes);
      } else if (layout == Fp8CodeLayout::as_is) {
        quantize_kernel<E><<<blocks_for(rows * cols), block_threads, 0, stream_>>>(in, rows, cols, scaling, amax,
                                                                                   format, codes);
      } else {
        launch_tiles<E, false>(stream_, in, rows, cols, format, scaling, amax, codes, scaling, amax, nullptr);
      }
    });
  }
  check_launch("fp8 quantize");
}

void CudaFp8::quantize_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                            const Fp8Coding& summed_columns, const Fp8Coding& summed_rows,
                            Fp8CodeLayout summed_rows_layout) {
  if (summed_rows_layout == Fp8CodeLayout::as_is) {  // nothing to transpose: two plain passes
    quantize(data, type, rows, cols, summed_columns.scaling, summed_columns.amax, format, Fp8CodeLayout::as_is,
             summed_columns.codes, summed_columns.inverse_scales);
    quantize(data, type, rows, cols, summed_rows.scaling, summed_rows.amax, format, Fp8CodeLayout::as_is,
             summed_rows.codes, summed_rows.inverse_scales);
    return;
  }
  for (const Fp8Coding* coding : {&summed_columns, &summed_rows}) {
    const std::int64_t count = fp8_scale_count(coding->scaling, rows, cols);
    inverse_scales_kernel<<<blocks_for(count), block_threads, 0, stream_>>>(coding->amax, count, format,
                                                                            coding->inverse_scales);
  }
  if (rows * cols > 0) {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch_tiles<E, true>(stream_, static_cast<const Stored<E>*>(data), rows, cols, format, summed_rows.scaling,
                            summed_rows.amax, summed_rows.codes, summed_columns.scaling, summed_columns.amax,
                            summed_columns.codes);
    });
  }
  check_launch("fp8 quantize pair");
}

void CudaFp8::gemm(const Fp8Gemm& call) {
  if (call.m == 0 || call.n == 0) return;
  if (call.k > 0 && matmul_.run(call)) return;
  emulate_gemm(call);
}

void CudaFp8::emulate_gemm(const Fp8Gemm& call) {
  const std::size_t a_bytes = aligned(static_cast<std::size_t>(call.m * call.k) * 2),
                    b_bytes = aligned(static_cast<std::size_t>(call.n * call.k) * 2);
  auto* scratch = static_cast<std::byte*>(
      scratch_.reserve(a_bytes + b_bytes + static_cast<std::size_t>(call.m * call.n) * sizeof(float)));
  auto* a_values = reinterpret_cast<__nv_bfloat16*>(scratch);
  auto* b_values = reinterpret_cast<__nv_bfloat16*>(scratch + a_bytes);
  auto* sums = reinterpret_cast<float*>(scratch + a_bytes + b_bytes);
  if (call.k == 0) {
    check(cudaMemsetAsync(sums, 0, static_cast<std::size_t>(call.m * call.n) * sizeof(float), stream_),
          "cudaMemsetAsync");
  } else {
    decode_kernel<DeviceBf16><<<blocks_for(call.m * call.k), block_threads, 0, stream_>>>(
        call.a, call.m * call.k, nullptr, call.a_format, a_values);
    decode_kernel<DeviceBf16><<<blocks_for(call.n * call.k), block_threads, 0, stream_>>>(
        call.b, call.n * call.k, nullptr, call.b_format, b_values);
    check_launch("fp8 decode");
    bf16_gemm_(fp8_values_product(call, a_values, b_values, sums));
  }
  with_device_element(call.c_type, [&](auto element) {
    using E = decltype(element);
    unscale_kernel<E><<<blocks_for(call.m * call.n), block_threads, 0, stream_>>>(
        sums, call.m, call.n, call.a_inverse, call.a_scales != Fp8Scaling::tensor, call.b_inverse,
        call.b_scales != Fp8Scaling::tensor, static_cast<const Stored<E>*>(call.bias), static_cast<Stored<E>*>(call.c),
        call.accumulate);
  });
  check_launch("fp8 unscale");
}

void CudaFp8::encode(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
                     std::uint8_t* codes) {
  if (count == 0) return;
  const auto elements = static_cast<std::int64_t>(count);
  with_device_element(type, [&](auto element) {
    using E = decltype(element);
    quantize_kernel<E><<<blocks_for(elements), block_threads, 0, stream_>>>(
        static_cast<const Stored<E>*>(values), 1, elements, Fp8Scaling::tensor, amax, format, codes);
  });
  check_launch("fp8 encode");
}

void CudaFp8::decode(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
                     DataType type) {
  if (count == 0) return;
  const auto elements = static_cast<std::int64_t>(count);
  with_device_element(type, [&](auto element) {
    using E = decltype(element);
    decode_kernel<E><<<blocks_for(elements), block_threads, 0, stream_>>>(codes, elements, amax, format,
                                                                          static_cast<Stored<E>*>(values));
  });
  check_launch("fp8 decode");
}

}  // namespace mlptrain
