// What the CUDA kernels' tests share: random inputs, device copies of host vectors, comparisons
// against the CPU backend, typed copies of fp32 values, and the fixture holding both backends.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace mlptrain::test {

inline std::vector<float> random_values(std::size_t count, std::uint64_t seed, float low = -2.0f, float high = 2.0f) {
  std::vector<float> values(count);
  CounterRng(seed, "cuda-kernel-test").fill_uniform(values.data(), 0, count, low, high);
  return values;
}

// A device copy of a host vector, read back on demand.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(1, size_) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return data_; }
  std::vector<T> host() const {
    std::vector<T> values(size_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Every element within `tolerance` of the CPU's, relative to the largest CPU magnitude.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance = 1e-5) {
  ASSERT_EQ(gpu.size(), cpu.size());
  double scale = 1e-30;
  for (float value : cpu) scale = std::max(scale, static_cast<double>(std::fabs(value)));
  for (std::size_t i = 0; i < cpu.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(gpu[i]) - cpu[i]), tolerance * scale) << "element " << i;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Kernels> cpu = make_cpu_kernels();
  std::unique_ptr<Kernels> gpu = make_cuda_kernels(0);
};

// Half-typed copies of fp32 values (the CPU's conversion), as bytes.
inline std::vector<std::uint8_t> typed(Kernels& cpu, const std::vector<float>& values, DataType type) {
  std::vector<std::uint8_t> bytes(values.size() * size_of(type));
  cpu.convert(values.data(), DataType::float32, bytes.data(), type, values.size());
  return bytes;
}
inline std::vector<float> widened(Kernels& cpu, const std::vector<std::uint8_t>& bytes, DataType type) {
  std::vector<float> values(bytes.size() / size_of(type));
  cpu.convert(bytes.data(), type, values.data(), DataType::float32, values.size());
  return values;
}

}  // namespace mlptrain::test
