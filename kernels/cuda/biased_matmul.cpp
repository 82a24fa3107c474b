// The biased GEMM through cuBLASLt's bias epilogue (see biased_matmul.hpp).
#include "kernels/cuda/biased_matmul.hpp"

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain {

namespace {

// cuBLAS's recommended workspace on Hopper.
constexpr std::size_t workspace_size = std::size_t{32} << 20;

cudaDataType_t library_type(DataType type) {
  switch (type) {
    case DataType::bfloat16: return CUDA_R_16BF;
    case DataType::float16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

cublasOperation_t operation(Transpose transpose) { return transpose == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The largest power of two up to 16 that divides the address.
int alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  int alignment = 16;
  while (alignment > 1 && address % static_cast<std::uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("cuBLASLt: ") + what + " failed (status " +
                         std::to_string(static_cast<int>(status)) + ")");
}

template <typename Value>
void set(cublasLtMatmulDesc_t description, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  check_lt(cublasLtMatmulDescSetAttribute(description, attribute, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}

}  // namespace

BiasedMatmul::BiasedMatmul(cudaStream_t stream, bool tf32) : stream_(stream), tf32_(tf32) {
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  check(cudaMalloc(&workspace_, workspace_size), "cudaMalloc");
  workspace_bytes_ = workspace_size;
}

BiasedMatmul::~BiasedMatmul() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.description);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its
// B our A, and the bias (one per column of our C) is one per row of its D, as the epilogue wants.
BiasedMatmul::Plan BiasedMatmul::make_plan(const Gemm& gemm) {
  Plan plan;
  const cublasComputeType_t compute = gemm.input == DataType::float32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
  check_lt(cublasLtMatmulDescCreate(&plan.description, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSA, operation(gemm.transpose_b));
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSB, operation(gemm.transpose_a));
  set(plan.description, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, library_type(gemm.output));
  // The heuristic reads the bias pointer for its alignment.
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);
  const cudaDataType_t input = library_type(gemm.input), output = library_type(gemm.output);
  const bool a_plain = gemm.transpose_b == Transpose::no, b_plain = gemm.transpose_a == Transpose::no;
  check_lt(cublasLtMatrixLayoutCreate(&plan.a, input, a_plain ? gemm.n : gemm.k, a_plain ? gemm.k : gemm.n, gemm.ldb),
           "cublasLtMatrixLayoutCreate");
  check_lt(cublasLtMatrixLayoutCreate(&plan.b, input, b_plain ? gemm.k : gemm.m, b_plain ? gemm.m : gemm.k, gemm.lda),
           "cublasLtMatrixLayoutCreate");
  check_lt(cublasLtMatrixLayoutCreate(&plan.c, output, gemm.n, gemm.m, gemm.ldc), "cublasLtMatrixLayoutCreate");

  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, std::uint32_t value) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value),
             "cublasLtMatmulPreferenceSetAttribute");
  };
  const std::uint64_t workspace = workspace_bytes_;
  check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                sizeof workspace),
           "cublasLtMatmulPreferenceSetAttribute");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(alignment_of(gemm.b)));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(alignment_of(gemm.a)));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(alignment_of(gemm.c)));
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(alignment_of(gemm.c)));
  // Split-K partial sums in fp32 only: reduced in the output's type, a 16-bit output would be
  // rounded before the bias is added (and more than once).
  prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.description, plan.a, plan.b, plan.c,
                                                                plan.c, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  plan.usable = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan.usable) plan.algorithm = result.algo;
  return plan;
}

bool BiasedMatmul::run(const Gemm& gemm) {
  // The epilogue reads the bias in vectors: a bias that is not 16-byte aligned takes the other
  // path, as do a bias of another type than the output (cuBLASLt's bias is of the output's type)
  // and a GEMM whose rows change from call to call (an expert's: a plan for each count would be
  // a heuristic call each time).
  if (gemm.beta != 0.0f || gemm.bias == nullptr || alignment_of(gemm.bias) < 16 || gemm.input != gemm.output ||
      gemm.varying != Varying::nothing)
    return false;
  const Key key{static_cast<int>(gemm.transpose_a), static_cast<int>(gemm.transpose_b), gemm.m, gemm.n, gemm.k,
                gemm.lda, gemm.ldb, gemm.ldc, static_cast<int>(gemm.input), static_cast<int>(gemm.output),
                alignment_of(gemm.a), alignment_of(gemm.b), alignment_of(gemm.c)};
  auto found = plans_.find(key);
  if (found == plans_.end()) found = plans_.emplace(key, make_plan(gemm)).first;
  Plan& plan = found->second;
  if (!plan.usable) return false;
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);
  const float beta = 0.0f;
  const cublasStatus_t status = cublasLtMatmul(handle_, plan.description, &gemm.alpha, gemm.b, plan.a, gemm.a, plan.b,
                                               &beta, gemm.c, plan.c, gemm.c, plan.c, &plan.algorithm, workspace_,
                                               workspace_bytes_, stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {  // this algorithm after all not for these operands
    plan.usable = false;
    return false;
  }
  check_lt(status, "cublasLtMatmul");
  return true;
}

}  // namespace mlptrain
