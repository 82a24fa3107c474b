// The CUDA backend's GEMMs (see cuda_gemms.hpp).
#include "kernels/cuda/cuda_gemms.hpp"

#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_kernels.cuh"
#include "kernels/cuda/layer_kernels.cuh"

namespace mlptrain {

namespace {

// Beside check(cudaError_t) of cuda_check.hpp, as an overload of it.
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("cuBLAS: ") + what + " failed (status " +
                         std::to_string(static_cast<int>(status)) + ")");
}

}  // namespace

CudaGemms::CudaGemms(cudaStream_t stream, DeviceScratch& scratch, bool tf32)
    : stream_(stream), scratch_(scratch), tf32_(tf32) {
  check(cublasCreate(&blas_), "cublasCreate");
  check(cublasSetStream(blas_, stream_), "cublasSetStream");
  // fp32 unless asked: results then compare with the CPU backend's. Split-K partial sums stay
  // in fp32 (a 16-bit output is rounded once, DESIGN.md §2.7), never in the output's type.
  const auto math = static_cast<cublasMath_t>((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  check(cublasSetMathMode(blas_, math), "cublasSetMathMode");
  lt_.emplace(stream_);
  biased_.emplace(*lt_, tf32);
}

CudaGemms::~CudaGemms() {
  biased_.reset();
  lt_.reset();
  cublasDestroy(blas_);
}

std::string CudaGemms::description() const {
  int version = 0;
  cublasGetVersion(blas_, &version);
  return "cuBLAS " + std::to_string(version) + (tf32_ ? ", fp32 GEMMs on TF32 tensor cores" : "");
}

void CudaGemms::run(const Gemm& gemm) {
  if (gemm.m == 0 || gemm.n == 0) return;
  if (gemm.bias == nullptr) {
    into(gemm, gemm.c, gemm.output, gemm.ldc);
    return;
  }
  if (gemm.beta != 0.0f) throw std::logic_error("a GEMM's bias is for beta = 0");
  if (biased_->run(gemm)) return;
  // Where cuBLASLt has no epilogue for it: the fp32 result first (in place for an fp32
  // output), then one pass adds the bias in fp32 and rounds once into the output.
  float* sums = static_cast<float*>(gemm.c);
  std::int64_t sums_leading = gemm.ldc;
  if (gemm.output != DataType::float32) {
    sums = static_cast<float*>(scratch_.reserve(static_cast<std::size_t>(gemm.m * gemm.n) * sizeof(float)));
    sums_leading = gemm.n;
  }
  into(gemm, sums, DataType::float32, sums_leading);
  with_device_element(gemm.input, [&](auto bias_element) {
    with_device_element(gemm.output, [&](auto out_element) {
      using B = decltype(bias_element);
      using Out = decltype(out_element);
      bias_round_kernel<B, Out><<<blocks_for(gemm.m * gemm.n), block_threads, 0, stream_>>>(
          sums, sums_leading, static_cast<const Stored<B>*>(gemm.bias), static_cast<Stored<Out>*>(gemm.c), gemm.ldc,
          gemm.m, gemm.n);
      check(cudaGetLastError(), "kernel launch");
    });
  });
}

void CudaGemms::into(const Gemm& gemm, void* c, DataType output, std::int64_t ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const auto operation = [](Transpose t) { return t == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; };
  // Products accumulate in fp32 whatever the inputs; fp32 inputs may use TF32 when asked.
  const cublasComputeType_t compute =
      gemm.input == DataType::float32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasGemmEx(blas_, operation(gemm.transpose_b), operation(gemm.transpose_a), static_cast<int>(gemm.n),
                     static_cast<int>(gemm.m), static_cast<int>(gemm.k), &gemm.alpha, gemm.b,
                     lt::library_type(gemm.input), static_cast<int>(gemm.ldb), gemm.a, lt::library_type(gemm.input),
                     static_cast<int>(gemm.lda), &gemm.beta, c, lt::library_type(output), static_cast<int>(ldc),
                     compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace mlptrain
