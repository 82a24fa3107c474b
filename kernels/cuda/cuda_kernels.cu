// The kernel interface on a GPU (see kernels.hpp): the GEMMs through cuBLAS and cuBLASLt
// (cuda_gemms.hpp; fp8's in fp8_kernels.hpp), one kernel per op for the rest, the built-in samples
// generated here, all on the backend's compute stream. The numerics follow the CPU
// backend: GELU in its erf form, softmax and loss sums in double, AdamW's scalars formed in double
// as torch.optim.AdamW forms them. Two things differ by design: reductions over many elements sum
// per block in double and combine blocks with atomics (the order varies, the double sum does not
// visibly), and column sums add blocks of rows first (layer_kernels.cuh), the fp32 sums in another
// order than the CPU's. (fmt's compile-time format strings do not build under nvcc: messages are
// plain strings.) Ops that return a value to the host (losses, AdamW's squared-gradient sum)
// synchronize the stream; the others only queue work.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/column_sums.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_gemms.hpp"
#include "kernels/cuda/device_kernels.cuh"
#include "kernels/cuda/fp8_kernels.hpp"
#include "kernels/cuda/layer_kernels.cuh"
#include "kernels/cuda/sample_kernels.hpp"

namespace mlptrain {

namespace {

class CudaKernels final : public Kernels {
 public:
  using Kernels::gelu_forward, Kernels::bias_add, Kernels::gelu_backward, Kernels::column_sums,
      Kernels::gather_rows, Kernels::sum_token_rows, Kernels::row_dots, Kernels::adamw,
      Kernels::sum_of_squares, Kernels::scale, Kernels::fill, Kernels::add;
  CudaKernels(int device, bool tf32) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&totals_device_, 2 * sizeof(double)), "cudaMalloc");
    check(cudaMallocHost(&totals_host_, 2 * sizeof(double)), "cudaMallocHost");
    int multiprocessors = 1;
    check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    scratch_.emplace(stream_);
    column_sums_.emplace(ColumnSums{.stream = stream_, .scratch = *scratch_, .multiprocessors = multiprocessors});
    gemms_.emplace(stream_, *scratch_, tf32);
    fp8_.emplace(gemms_->lt(), *scratch_, [this](const Gemm& product) { gemm(product); });
  }
  ~CudaKernels() override {
    cudaStreamSynchronize(stream_);  // before the GEMMs' workspace goes
    fp8_.reset();
    gemms_.reset();
    column_sums_.reset();
    scratch_.reset();
    cudaStreamSynchronize(stream_);
    cudaFreeHost(totals_host_);
    cudaFree(totals_device_);
    cudaStreamDestroy(stream_);
  }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  Device device() const override { return Device::cuda; }
  cudaStream_t stream() const { return stream_; }

  std::string description() const override { return gemms_->description(); }

  void gemm(const Gemm& gemm) override { gemms_->run(gemm); }

  void convert(const void* source, DataType source_type, void* destination, DataType destination_type,
               std::size_t count) override {
    if (source_type == destination_type) {
      if (count > 0)
        check(cudaMemcpyAsync(destination, source, count * size_of(source_type), cudaMemcpyDeviceToDevice, stream_),
              "cudaMemcpyAsync");
      return;
    }
    launch_convert<false>(source, source_type, destination, destination_type, count, nullptr);
  }
  void convert_amax(const void* source, DataType source_type, void* destination, DataType destination_type,
                    std::size_t count, float* amax) override {
    check(cudaMemsetAsync(amax, 0, sizeof(float), stream_), "cudaMemsetAsync");
    launch_convert<true>(source, source_type, destination, destination_type, count,
                         reinterpret_cast<std::uint32_t*>(amax));
  }

  void gelu_forward(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type) override {
    launch_gelu_forward<false>(pre, activated, rows * cols, type, nullptr);
  }
  void gelu_forward_amax(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type,
                         float* amax) override {
    check(cudaMemsetAsync(amax, 0, sizeof(float), stream_), "cudaMemsetAsync");
    launch_gelu_forward<true>(pre, activated, rows * cols, type, reinterpret_cast<std::uint32_t*>(amax));
  }
  void gelu_backward_amax(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                          DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols,
                          float* amax) override {
    if (cols <= 0) {
      check(cudaMemsetAsync(amax, 0, sizeof(float), stream_), "cudaMemsetAsync");
      return;
    }
    column_sums_->run({.data = grad_activated, .pre = pre, .grad_pre = grad_pre, .type = type, .sums = bias_grad,
                       .sums_type = bias_grad_type, .accumulate = accumulate, .rows = rows, .cols = cols,
                       .amax = amax});
  }
  void bias_add(void* data, const void* bias, std::int64_t rows, std::int64_t cols, DataType type) override {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(bias_add_kernel<E>, rows * cols, static_cast<Stored<E>*>(data), static_cast<const Stored<E>*>(bias), rows,
             cols);
    });
  }
  void gelu_backward(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                     DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols) override {
    column_sums_->run({.data = grad_activated, .pre = pre, .grad_pre = grad_pre, .type = type, .sums = bias_grad,
                       .sums_type = bias_grad_type, .accumulate = accumulate, .rows = rows, .cols = cols});
  }
  void column_sums(const void* data, DataType type, void* sums, DataType sums_type, bool accumulate,
                   std::int64_t rows, std::int64_t cols) override {
    column_sums_->run({.data = data, .type = type, .sums = sums, .sums_type = sums_type, .accumulate = accumulate,
                       .rows = rows, .cols = cols});
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
  void gather_rows(const void* source, const std::int32_t* indices, const float* scales, void* destination,
                   std::int64_t rows, std::int64_t cols, DataType type) override {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(gather_rows_kernel<E>, rows * cols, static_cast<const Stored<E>*>(source), indices, scales,
             static_cast<Stored<E>*>(destination), rows, cols);
    });
  }
  void sum_token_rows(const void* source, DataType source_type, const std::int32_t* row_begin,
                      const std::int32_t* rows, const float* scales, void* destination, DataType destination_type,
                      std::int64_t tokens, std::int64_t cols) override {
    with_device_element(source_type, [&](auto source_element) {
      with_device_element(destination_type, [&](auto destination_element) {
        using S = decltype(source_element);
        using D = decltype(destination_element);
        launch(sum_token_rows_kernel<S, D>, tokens * cols, static_cast<const Stored<S>*>(source), row_begin, rows,
               scales, static_cast<Stored<D>*>(destination), tokens, cols);
      });
    });
  }
  void row_dots(const void* a, const std::int32_t* indices, const void* b, float* dots, std::int64_t rows,
                std::int64_t cols, DataType type) override {
    if (rows == 0) return;
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      row_dots_kernel<E><<<static_cast<unsigned>(rows), block_threads, 0, stream_>>>(
          static_cast<const Stored<E>*>(a), indices, static_cast<const Stored<E>*>(b), dots, cols);
    });
    check(cudaGetLastError(), "row_dots launch");
  }

  double adamw(float* master, const void* grads, DataType grads_type, float* exp_avg, float* exp_avg_sq,
               std::size_t count, const AdamWStep& step, void* compute_copy, DataType compute_type) override {
    const AdamWRange range{.master = master, .grads = grads, .exp_avg = exp_avg, .exp_avg_sq = exp_avg_sq,
                           .count = count, .compute_copy = compute_copy};
    return adamw(std::span<const AdamWRange>(&range, 1), grads_type, step, compute_type);
  }
  double adamw(std::span<const AdamWRange> ranges, DataType grads_type, const AdamWStep& step,
               DataType compute_type) override {
    // The scalars are formed as the CPU's update forms them (kernels/cpu/cpu_kernels.cpp).
    const double correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
    const double correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
    const auto beta1 = static_cast<float>(step.beta1), beta2 = static_cast<float>(step.beta2);
    const AdamWScalars scalars{.step_size = static_cast<float>(step.learning_rate / correction1),
                               .inverse_correction2_sqrt = 1.0f / static_cast<float>(std::sqrt(correction2)),
                               .decay = static_cast<float>(1.0 - step.learning_rate * step.weight_decay),
                               .beta1 = beta1,
                               .beta2 = beta2,
                               .one_minus_beta1 = 1.0f - beta1,
                               .one_minus_beta2 = 1.0f - beta2,
                               .eps = static_cast<float>(step.eps),
                               .grad_scale = step.grad_scale};
    clear_totals();
    // One launch a table of ranges: a step's layers (or shards) fill one table or a few; empty
    // ranges are passed over.
    for (std::size_t next = 0; next < ranges.size();) {
      AdamWRangeTable table{};
      std::int64_t end = 0;
      for (; next < ranges.size() && table.count < adamw_ranges_per_launch; ++next) {
        const AdamWRange& range = ranges[next];
        if (range.count == 0) continue;
        table.ranges[table.count] = {range.master, range.grads, range.exp_avg, range.exp_avg_sq, range.compute_copy};
        end += static_cast<std::int64_t>(range.count);
        table.ends[table.count] = end;
        if (range.counted) table.counted |= std::uint64_t{1} << table.count;
        ++table.count;
      }
      if (table.count == 0) continue;
      with_device_element(grads_type, [&](auto grad_element) {
        with_device_element(compute_type, [&](auto copy_element) {
          using G = decltype(grad_element);
          using C = decltype(copy_element);
          launch(adamw_kernel<G, C>, end, table, scalars, totals_device_);
        });
      });
    }
    return read_totals()[0];
  }

  void generate_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::int64_t count,
                        float* inputs, float* targets, std::int32_t* labels) override {
    // Scratch for what the caller does not take: the inputs a teacher's targets need, the labels
    // a mixture's inputs need.
    const bool teacher = samples.kind == SyntheticKind::teacher;
    const std::size_t input_bytes =
        teacher && inputs == nullptr && targets != nullptr ? static_cast<std::size_t>(count * samples.input_dim) * sizeof(float) : 0;
    const std::size_t label_bytes = !teacher && labels == nullptr ? static_cast<std::size_t>(count) * sizeof(std::int32_t) : 0;
    std::byte* scratch = input_bytes + label_bytes > 0 ? static_cast<std::byte*>(scratch_->reserve(input_bytes + label_bytes)) : nullptr;
    const SampleScratch spare{.inputs = input_bytes > 0 ? reinterpret_cast<float*>(scratch) : nullptr,
                              .labels = label_bytes > 0 ? reinterpret_cast<std::int32_t*>(scratch + input_bytes) : nullptr};
    launch_builtin_samples(samples, stream_indices, count, inputs, targets, labels, spare, stream_);
  }

  void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    float* amax) override {
    fp8_->absolute_max(data, type, rows, cols, scaling, amax);
  }
  void quantize_fp8(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes,
                    float* inverse_scales) override {
    fp8_->quantize(data, type, rows, cols, scaling, amax, format, layout, codes, inverse_scales);
  }
  void quantize_fp8_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                         const Fp8Coding& summed_columns, const Fp8Coding& summed_rows,
                         Fp8CodeLayout summed_rows_layout) override {
    fp8_->quantize_pair(data, type, rows, cols, format, summed_columns, summed_rows, summed_rows_layout);
  }
  void fp8_gemm(const Fp8Gemm& call) override { fp8_->gemm(call); }
  void encode_fp8(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
                  std::uint8_t* codes) override {
    fp8_->encode(values, type, count, amax, format, codes);
  }
  void decode_fp8(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
                  DataType type) override {
    fp8_->decode(codes, count, amax, format, values, type);
  }

  double sum_of_squares(const void* data, DataType type, std::size_t count) override {
    clear_totals();
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(sum_of_squares_kernel<E>, static_cast<std::int64_t>(count), static_cast<const Stored<E>*>(data),
             static_cast<std::int64_t>(count), totals_device_);
    });
    return read_totals()[0];
  }
  void scale(void* data, DataType type, std::size_t count, float factor) override {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(scale_kernel<E>, static_cast<std::int64_t>(count), static_cast<Stored<E>*>(data),
             static_cast<std::int64_t>(count), factor);
    });
  }
  void fill(void* data, DataType type, std::size_t count, float value) override {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(fill_kernel<E>, static_cast<std::int64_t>(count), static_cast<Stored<E>*>(data),
             static_cast<std::int64_t>(count), value);
    });
  }
  void add(void* destination, const void* source, DataType type, std::size_t count) override {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      launch(add_kernel<E>, static_cast<std::int64_t>(count), static_cast<Stored<E>*>(destination),
             static_cast<const Stored<E>*>(source), static_cast<std::int64_t>(count));
    });
  }

 private:
  // Launches `kernel` over `count` work items (elements, rows or columns) on the compute stream.
  template <typename... Parameters, typename... Arguments>
  void launch(void (*kernel)(Parameters...), std::int64_t count, Arguments... arguments) {
    if (count <= 0) return;
    kernel<<<blocks_for(count), block_threads, 0, stream_>>>(arguments...);
    check(cudaGetLastError(), "kernel launch");
  }
  template <bool takes_amax>
  void launch_convert(const void* source, DataType source_type, void* destination, DataType destination_type,
                      std::size_t count, std::uint32_t* amax_bits) {
    with_device_element(source_type, [&](auto in) {
      with_device_element(destination_type, [&](auto out) {
        using In = decltype(in);
        using Out = decltype(out);
        launch(convert_kernel<In, Out, takes_amax>, static_cast<std::int64_t>(count),
               static_cast<const Stored<In>*>(source), static_cast<Stored<Out>*>(destination),
               static_cast<std::int64_t>(count), amax_bits);
      });
    });
  }
  // GELU in packs where the pointers and the count allow, one element at a time otherwise.
  template <bool takes_amax>
  void launch_gelu_forward(const void* pre, void* activated, std::int64_t count, DataType type,
                           std::uint32_t* amax_bits) {
    with_device_element(type, [&](auto element) {
      using E = decltype(element);
      constexpr int V = pack_width<E>;
      const auto* in = static_cast<const Stored<E>*>(pre);
      auto* out = static_cast<Stored<E>*>(activated);
      if (packs_fit({pre, activated}, count, V))
        launch(gelu_forward_kernel<E, V, takes_amax>, count / V, in, out, count / V, amax_bits);
      else
        launch(gelu_forward_kernel<E, 1, takes_amax>, count, in, out, count, amax_bits);
    });
  }
  void clear_totals() { check(cudaMemsetAsync(totals_device_, 0, 2 * sizeof(double), stream_), "cudaMemsetAsync"); }
  const double* read_totals() {
    check(cudaMemcpyAsync(totals_host_, totals_device_, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return totals_host_;
  }

  cudaStream_t stream_ = nullptr;
  double* totals_device_ = nullptr;  // the reductions' sums
  double* totals_host_ = nullptr;    // pinned, for reading them back
  // The scratch first: the column sums use it (and go before it).
  std::optional<DeviceScratch> scratch_;
  std::optional<ColumnSums> column_sums_;
  std::optional<CudaGemms> gemms_;  // the GEMMs (use the scratch), and the cuBLASLt context fp8's borrow
  std::optional<CudaFp8> fp8_;      // fp8 operands and GEMMs (use the scratch)
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(int device, bool tf32) {
  return std::make_unique<CudaKernels>(device, tf32);
}

void* cuda_compute_stream(Kernels& kernels) {
  auto* cuda = dynamic_cast<CudaKernels*>(&kernels);
  return cuda != nullptr ? static_cast<void*>(cuda->stream()) : nullptr;
}

}  // namespace mlptrain
