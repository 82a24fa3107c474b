// The CUDA backend's GEMMs (Kernels::gemm's contract): cuBLAS for plain products, cuBLASLt where
// the bias goes into the epilogue, and where it has no epilogue for a shape the fp32 product first
// and one pass that adds the bias and rounds once. Products accumulate in fp32; fp32 inputs run
// on TF32 tensor cores where asked. It also holds the cuBLASLt context the fp8 matmul borrows.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/biased_matmul.hpp"
#include "kernels/cuda/device_scratch.hpp"
#include "kernels/cuda/lt_support.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

class CudaGemms {
 public:
  // On `stream`; the bias's fallback borrows `scratch` for its fp32 sums.
  CudaGemms(cudaStream_t stream, DeviceScratch& scratch, bool tf32);
  ~CudaGemms();
  CudaGemms(const CudaGemms&) = delete;
  CudaGemms& operator=(const CudaGemms&) = delete;

  void run(const Gemm& gemm);
  std::string description() const;  // the library's version, and TF32 where it is on
  const lt::Context& lt() const { return *lt_; }

 private:
  // c = op(a) op(b) (alpha, beta as given) into `c` of `output` elements, leading dimension `ldc`.
  void into(const Gemm& gemm, void* c, DataType output, std::int64_t ldc);

  cudaStream_t stream_;
  DeviceScratch& scratch_;
  bool tf32_;
  cublasHandle_t blas_ = nullptr;
  std::optional<lt::Context> lt_;       // cuBLASLt's handle and workspace
  std::optional<BiasedMatmul> biased_;  // biased GEMMs through cuBLASLt's epilogue
};

}  // namespace mlptrain
