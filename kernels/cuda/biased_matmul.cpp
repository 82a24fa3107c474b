// The biased GEMM through cuBLASLt's bias epilogue (see biased_matmul.hpp).
#include "kernels/cuda/biased_matmul.hpp"

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/lt_support.hpp"

namespace mlptrain {

using lt::alignment_of, lt::check, lt::library_type, lt::set;

namespace {

cublasOperation_t operation(Transpose transpose) { return transpose == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

BiasedMatmul::~BiasedMatmul() {
  for (auto& [key, plan] : plans_) plan.destroy();
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its
// B our A, and the bias (one per column of our C) is one per row of its D, as the epilogue wants.
lt::Plan BiasedMatmul::make_plan(const Gemm& gemm) {
  lt::Plan plan;
  const cublasComputeType_t compute = gemm.input == DataType::float32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
  check(cublasLtMatmulDescCreate(&plan.description, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSA, operation(gemm.transpose_b));
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSB, operation(gemm.transpose_a));
  set(plan.description, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, library_type(gemm.output));
  // The heuristic reads the bias pointer for its alignment.
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);
  const cudaDataType_t input = library_type(gemm.input), output = library_type(gemm.output);
  const bool a_plain = gemm.transpose_b == Transpose::no, b_plain = gemm.transpose_a == Transpose::no;
  check(cublasLtMatrixLayoutCreate(&plan.a, input, a_plain ? gemm.n : gemm.k, a_plain ? gemm.k : gemm.n, gemm.ldb),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.b, input, b_plain ? gemm.k : gemm.m, b_plain ? gemm.m : gemm.k, gemm.lda),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.c, output, gemm.n, gemm.m, gemm.ldc), "cublasLtMatrixLayoutCreate");

  lt::choose_algorithm(lt_.handle, plan, lt::workspace_size, alignment_of(gemm.b), alignment_of(gemm.a),
                       alignment_of(gemm.c), gemm.output != DataType::float32);
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
  lt::Plan& plan = found->second;
  if (!plan.usable) return false;
  set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);
  const float beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(lt_.handle, plan.description, &gemm.alpha, gemm.b, plan.a, gemm.a, plan.b, &beta, gemm.c,
                     plan.c, gemm.c, plan.c, &plan.algorithm, lt_.workspace, lt::workspace_size, lt_.stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {  // this algorithm after all not for these operands
    plan.usable = false;
    return false;
  }
  check(status, "cublasLtMatmul");
  return true;
}

}  // namespace mlptrain
