// The CUDA backend's fp8 ops (see fp8_kernels.hpp): the amax kernels, the launches of the casts
// (fp8_casts.cuh), the GEMM and ZeRO-3's encoding. Maxima compare magnitudes as their bits, which
// order non-negative floats as their values do, so blocks combine them with atomicMax on the
// bits; every element's scale comes from its scale's amax through fp8::scale_for, the one the
// CPU uses.
#include "kernels/cuda/fp8_kernels.hpp"

#include <algorithm>

#include "core/fp8.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_kernels.cuh"
#include "kernels/cuda/fp8_casts.cuh"

namespace mlptrain {

namespace {

constexpr int warp_size = 32;

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
