// The loopback device (see loopback_backend.hpp): tagged pointers over the host allocator, and
// the CPU kernels behind a wrapper that strips the tag from every pointer it is given.
#include "kernels/loopback/loopback_backend.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace mlptrain {

namespace {

// Bit 62 set makes an x86-64 or AArch64 user address non-canonical: dereferencing it faults.
constexpr std::uintptr_t device_tag = std::uintptr_t{1} << 62;

bool tagged(const void* pointer) { return (reinterpret_cast<std::uintptr_t>(pointer) & device_tag) != 0; }

[[noreturn]] void misuse(const char* what) {
  // Abort rather than throw: the other ranks would wait for this one inside a collective.
  std::fprintf(stderr, "mlptrain: loopback device: %s\n", what);
  std::abort();
}

// The host address behind a device pointer (null stays null).
template <typename T>
T* host(T* pointer) {
  if (pointer == nullptr) return nullptr;
  if (!tagged(pointer)) misuse("a host pointer was passed where device memory belongs");
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(pointer) - device_tag);
}

template <typename T>
T* untagged(T* pointer) {
  if (tagged(pointer)) misuse("a device pointer was passed where host memory belongs");
  return pointer;
}

// One direction's background copies: a thread that copies in the order the copies were
// started, as a GPU's copy stream does. Copy n is done once `done_` reaches n.
class CopyQueue {
 public:
  CopyQueue() : thread_([this] { run(); }) {}
  ~CopyQueue() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  std::uint64_t start(void* destination, const void* source, std::size_t bytes) {
    std::uint64_t number = 0;
    {
      const std::lock_guard lock(mutex_);
      pending_.push_back({destination, source, bytes});
      number = ++started_;
    }
    wake_.notify_all();
    return number;
  }
  bool done(std::uint64_t number) const { return done_.load(std::memory_order_acquire) >= number; }
  void wait(std::uint64_t number) {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return done(number); });
  }

 private:
  struct Copy {
    void* destination;
    const void* source;
    std::size_t bytes;
  };
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      const Copy copy = pending_.front();
      pending_.pop_front();
      lock.unlock();
      if (copy.bytes > 0) std::memcpy(copy.destination, copy.source, copy.bytes);
      lock.lock();
      done_.fetch_add(1, std::memory_order_release);
      finished_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::deque<Copy> pending_;
  std::uint64_t started_ = 0;
  std::atomic<std::uint64_t> done_{0};
  bool stopping_ = false;
  std::thread thread_;  // last: it starts on a complete queue
};

// Background copies on a thread per direction, so host staging's pieces really overlap their
// copies with MPI here too, and a missing wait shows up as a wrong result.
class LoopbackCopier final : public AsyncCopier {
 public:
  explicit LoopbackCopier(int lanes)
      : AsyncCopier(lanes), to_host_(static_cast<std::size_t>(lanes)), to_device_(to_host_.size()) {}
  Allocator& host_memory() override { return host_memory_; }
  void start_to_host(int lane, void* destination, const void* device, std::size_t bytes) override {
    to_host_[lane_index(lane)] = down_.start(untagged(destination), host(device), bytes);
  }
  void start_to_device(int lane, void* device, const void* source, std::size_t bytes) override {
    to_device_[lane_index(lane)] = up_.start(host(device), untagged(source), bytes);
  }
  void wait_to_host(int lane) override { down_.wait(to_host_[lane_index(lane)]); }
  void wait_to_device(int lane) override { up_.wait(to_device_[lane_index(lane)]); }
  bool test_to_host(int lane) override { return down_.done(to_host_[lane_index(lane)]); }
  bool test_to_device(int lane) override { return up_.done(to_device_[lane_index(lane)]); }
  // The host runs the loopback device's work, so it waits itself.
  void order_device_after_to_device(int lane) override { wait_to_device(lane); }

 private:
  MemoryLedger ledger_;  // staging memory is the host's, not the device's
  HostAllocator host_memory_{ledger_};
  std::vector<std::uint64_t> to_host_, to_device_;  // each lane's latest copy's number
  CopyQueue down_, up_;
};

class LoopbackAllocator final : public HostAllocator {
 public:
  using HostAllocator::HostAllocator;
  std::unique_ptr<AsyncCopier> make_async_copier(int lanes) override {
    return std::make_unique<LoopbackCopier>(lanes);
  }
  Device device() const override { return Device::loopback; }
  void zero(void* data, std::size_t bytes) override { Allocator::zero(host(data), bytes); }
  void copy_to_device(void* device, const void* source, std::size_t bytes) override {
    Allocator::copy_to_device(host(device), untagged(source), bytes);
  }
  void copy_to_host(void* destination, const void* device, std::size_t bytes) override {
    Allocator::copy_to_host(untagged(destination), host(device), bytes);
  }
  bool is_device_memory(const void* pointer) const override { return tagged(pointer); }

 protected:
  void* obtain(std::size_t bytes) override {
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(HostAllocator::obtain(bytes)) |
                                   device_tag);
  }
  void give_back(void* data, std::size_t bytes) override { HostAllocator::give_back(host(data), bytes); }
};

class LoopbackKernels final : public Kernels {
 public:
  using Kernels::gelu_forward, Kernels::bias_add, Kernels::gelu_backward, Kernels::column_sums,
      Kernels::gather_rows, Kernels::sum_token_rows, Kernels::row_dots, Kernels::adamw,
      Kernels::sum_of_squares, Kernels::scale, Kernels::fill, Kernels::add;
  Device device() const override { return Device::loopback; }
  std::string description() const override { return cpu_->description(); }

  void gemm(const Gemm& gemm) override {
    Gemm on_host = gemm;
    on_host.a = host(gemm.a);
    on_host.b = host(gemm.b);
    on_host.c = host(gemm.c);
    on_host.bias = host(gemm.bias);
    cpu_->gemm(on_host);
  }
  void convert(const void* source, DataType source_type, void* destination,
               DataType destination_type, std::size_t count) override {
    cpu_->convert(host(source), source_type, host(destination), destination_type, count);
  }
  void gelu_forward(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type) override {
    cpu_->gelu_forward(host(pre), host(activated), rows, cols, type);
  }
  void bias_add(void* data, const void* bias, std::int64_t rows, std::int64_t cols, DataType type) override {
    cpu_->bias_add(host(data), host(bias), rows, cols, type);
  }
  void gelu_backward(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                     DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols) override {
    cpu_->gelu_backward(host(grad_activated), host(pre), host(grad_pre), type, host(bias_grad), bias_grad_type,
                        accumulate, rows, cols);
  }
  void convert_amax(const void* source, DataType source_type, void* destination, DataType destination_type,
                    std::size_t count, float* amax) override {
    cpu_->convert_amax(host(source), source_type, host(destination), destination_type, count, host(amax));
  }
  void gelu_forward_amax(const void* pre, void* activated, std::int64_t rows, std::int64_t cols, DataType type,
                         float* amax) override {
    cpu_->gelu_forward_amax(host(pre), host(activated), rows, cols, type, host(amax));
  }
  void gelu_backward_amax(const void* grad_activated, const void* pre, void* grad_pre, DataType type, void* bias_grad,
                          DataType bias_grad_type, bool accumulate, std::int64_t rows, std::int64_t cols,
                          float* amax) override {
    cpu_->gelu_backward_amax(host(grad_activated), host(pre), host(grad_pre), type, host(bias_grad), bias_grad_type,
                             accumulate, rows, cols, host(amax));
  }
  void column_sums(const void* data, DataType type, void* sums, DataType sums_type, bool accumulate,
                   std::int64_t rows, std::int64_t cols) override {
    cpu_->column_sums(host(data), type, host(sums), sums_type, accumulate, rows, cols);
  }
  double mse(const float* prediction, const float* target, float* grad, std::int64_t rows,
             std::int64_t cols, float grad_scale) override {
    return cpu_->mse(host(prediction), host(target), host(grad), rows, cols, grad_scale);
  }
  CrossEntropyResult cross_entropy(const float* logits, const std::int32_t* labels, float* grad,
                                   std::int64_t rows, std::int64_t cols, float grad_scale) override {
    return cpu_->cross_entropy(host(logits), host(labels), host(grad), rows, cols, grad_scale);
  }
  void softmax_rows(float* data, std::int64_t rows, std::int64_t cols) override {
    cpu_->softmax_rows(host(data), rows, cols);
  }
  void softmax_backward_rows(const float* probabilities, const float* grad_probabilities,
                             float* grad_logits, std::int64_t rows, std::int64_t cols) override {
    cpu_->softmax_backward_rows(host(probabilities), host(grad_probabilities), host(grad_logits), rows,
                                cols);
  }
  void gather_rows(const void* source, const std::int32_t* indices, const float* scales, void* destination,
                   std::int64_t rows, std::int64_t cols, DataType type) override {
    cpu_->gather_rows(host(source), host(indices), host(scales), host(destination), rows, cols, type);
  }
  void sum_token_rows(const void* source, DataType source_type, const std::int32_t* row_begin,
                      const std::int32_t* rows, const float* scales, void* destination, DataType destination_type,
                      std::int64_t tokens, std::int64_t cols) override {
    cpu_->sum_token_rows(host(source), source_type, host(row_begin), host(rows), host(scales), host(destination),
                         destination_type, tokens, cols);
  }
  void row_dots(const void* a, const std::int32_t* indices, const void* b, float* dots, std::int64_t rows,
                std::int64_t cols, DataType type) override {
    cpu_->row_dots(host(a), host(indices), host(b), host(dots), rows, cols, type);
  }
  void generate_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::int64_t count,
                        float* inputs, float* targets, std::int32_t* labels) override {
    SyntheticSamples on_host = samples;
    on_host.first_table = host(samples.first_table);
    on_host.second_table = host(samples.second_table);
    cpu_->generate_samples(on_host, host(stream_indices), count, host(inputs), host(targets), host(labels));
  }
  double adamw(float* master, const void* grads, DataType grads_type, float* exp_avg, float* exp_avg_sq,
               std::size_t count, const AdamWStep& step, void* compute_copy, DataType compute_type) override {
    return cpu_->adamw(host(master), host(grads), grads_type, host(exp_avg), host(exp_avg_sq), count, step,
                       host(compute_copy), compute_type);
  }
  void absolute_max(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    float* amax) override {
    cpu_->absolute_max(host(data), type, rows, cols, scaling, host(amax));
  }
  void quantize_fp8(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Scaling scaling,
                    const float* amax, Fp8Format format, Fp8CodeLayout layout, std::uint8_t* codes,
                    float* inverse_scales) override {
    cpu_->quantize_fp8(host(data), type, rows, cols, scaling, host(amax), format, layout, host(codes),
                       host(inverse_scales));
  }
  void quantize_fp8_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols, Fp8Format format,
                         const Fp8Coding& summed_columns, const Fp8Coding& summed_rows,
                         Fp8CodeLayout summed_rows_layout) override {
    const auto on_host = [this](const Fp8Coding& coding) {
      return Fp8Coding{.scaling = coding.scaling, .amax = host(coding.amax), .codes = host(coding.codes),
                       .inverse_scales = host(coding.inverse_scales)};
    };
    cpu_->quantize_fp8_pair(host(data), type, rows, cols, format, on_host(summed_columns), on_host(summed_rows),
                            summed_rows_layout);
  }
  // fp8_summed_rows_layout stays Kernels' default, a GPU's (transposed codes), not the CPU's: the
  // device path's layout runs here.
  void fp8_gemm(const Fp8Gemm& call) override {
    Fp8Gemm on_host = call;
    on_host.a = host(call.a);
    on_host.a_inverse = host(call.a_inverse);
    on_host.b = host(call.b);
    on_host.b_inverse = host(call.b_inverse);
    on_host.bias = host(call.bias);
    on_host.c = host(call.c);
    on_host.workspace = host(call.workspace);
    cpu_->fp8_gemm(on_host);
  }
  std::size_t fp8_gemm_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k) const override {
    return cpu_->fp8_gemm_workspace_bytes(m, n, k);
  }
  void encode_fp8(const void* values, DataType type, std::size_t count, const float* amax, Fp8Format format,
                  std::uint8_t* codes) override {
    cpu_->encode_fp8(host(values), type, count, host(amax), format, host(codes));
  }
  void decode_fp8(const std::uint8_t* codes, std::size_t count, const float* amax, Fp8Format format, void* values,
                  DataType type) override {
    cpu_->decode_fp8(host(codes), count, host(amax), format, host(values), type);
  }
  double sum_of_squares(const void* data, DataType type, std::size_t count) override {
    return cpu_->sum_of_squares(host(data), type, count);
  }
  void scale(void* data, DataType type, std::size_t count, float factor) override {
    cpu_->scale(host(data), type, count, factor);
  }
  void fill(void* data, DataType type, std::size_t count, float value) override {
    cpu_->fill(host(data), type, count, value);
  }
  void add(void* destination, const void* source, DataType type, std::size_t count) override {
    cpu_->add(host(destination), host(source), type, count);
  }

 private:
  std::unique_ptr<Kernels> cpu_ = make_cpu_kernels();
};

}  // namespace

std::unique_ptr<Allocator> make_loopback_allocator(MemoryLedger& ledger) {
  return std::make_unique<LoopbackAllocator>(ledger);
}

std::unique_ptr<Kernels> make_loopback_kernels() { return std::make_unique<LoopbackKernels>(); }

}  // namespace mlptrain
