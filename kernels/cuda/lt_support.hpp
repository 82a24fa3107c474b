// What the backend's cuBLASLt GEMMs share (biased_matmul.cpp, fp8_matmul.cpp): the handle and its
// workspace, a failed call as the error users read, the library's element types, attribute
// setters, the alignment the heuristic is told of, and the preference every plan starts from.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "core/data_type.hpp"
#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain::lt {

// cuBLAS's recommended workspace on Hopper.
constexpr std::size_t workspace_size = std::size_t{32} << 20;

inline void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("cuBLASLt: ") + what + " failed (status " +
                         std::to_string(static_cast<int>(status)) + ")");
}

inline cudaDataType_t library_type(DataType type) {
  switch (type) {
    case DataType::bfloat16: return CUDA_R_16BF;
    case DataType::float16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The largest power of two up to 16 that divides the address.
inline int alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  int alignment = 16;
  while (alignment > 1 && address % static_cast<std::uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

// A cuBLASLt handle and the workspace its matmuls borrow, on one stream: the GEMMs queued there
// run one after another, so one workspace serves them all.
class Context {
 public:
  explicit Context(cudaStream_t compute_stream) : stream(compute_stream) {
    check(cublasLtCreate(&handle), "cublasLtCreate");
    ::mlptrain::check(cudaMalloc(&workspace, workspace_size), "cudaMalloc");
  }
  ~Context() {
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaStream_t stream;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

template <typename Value>
void set(cublasLtMatmulDesc_t description, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  check(cublasLtMatmulDescSetAttribute(description, attribute, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}

// A layout, a plan's description and its chosen algorithm, destroyed with the plan.
struct Plan {
  cublasLtMatmulDesc_t description = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  bool usable = false;

  void destroy() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(description);
  }
};

// The heuristic's first algorithm for a plan whose description and layouts are set (D laid out
// as C), with the operands' alignments in bytes, split-K partial sums reduced in fp32 only, and,
// for a 16-bit output, no split-K at all: on an H200 (cuBLAS 13.1) the heuristic's first
// algorithm for a 64 x 96 x 257 bf16 GEMM rounded the sum to bf16 before adding the bias (257 +
// 0.5 gave 256, 257 + 2 gave 258), where the contract rounds once; a split of k reduced apart
// from the epilogue is the suspected cause (tests/kernels/test_cuda_training_kernels.cpp).
// Sets plan.usable; where no algorithm qualifies the caller takes its other path.
inline void choose_algorithm(cublasLtHandle_t handle, Plan& plan, std::size_t workspace_bytes, int a_alignment,
                             int b_alignment, int c_alignment, bool sixteen_bit_output) {
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, std::uint32_t value) {
    check(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value),
          "cublasLtMatmulPreferenceSetAttribute");
  };
  const std::uint64_t workspace = workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(a_alignment));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(b_alignment));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(c_alignment));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(c_alignment));
  prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  constexpr int candidates = 8;
  cublasLtMatmulHeuristicResult_t results[candidates]{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, plan.description, plan.a, plan.b, plan.c,
                                                                plan.c, preference, candidates, results, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  plan.usable = false;
  for (int index = 0; status == CUBLAS_STATUS_SUCCESS && index < found && !plan.usable; ++index) {
    if (results[index].state != CUBLAS_STATUS_SUCCESS) continue;
    std::int32_t splits = 1;
    std::size_t written = 0;
    if (sixteen_bit_output &&
        cublasLtMatmulAlgoConfigGetAttribute(&results[index].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof splits, &written) == CUBLAS_STATUS_SUCCESS &&
        written == sizeof splits && splits > 1)
      continue;
    plan.algorithm = results[index].algo;
    plan.usable = true;
  }
}

}  // namespace mlptrain::lt
