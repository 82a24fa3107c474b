// The fp8 GEMM through cuBLASLt (see fp8_matmul.hpp).
#include "kernels/cuda/fp8_matmul.hpp"

#include "kernels/cuda/cuda_check.hpp"

namespace mlptrain {

using lt::alignment_of, lt::check, lt::library_type, lt::set;

namespace {

cudaDataType_t code_type(Fp8Format format) { return format == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

std::int32_t scale_mode(Fp8Scaling scales) {
  return scales == Fp8Scaling::tensor ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                                      : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
}

}  // namespace

Fp8Matmul::~Fp8Matmul() {
  for (auto& [key, plan] : plans_) plan.destroy();
}

// Row-major c [m, n] = a [m, k] b [n, k]^T is column-major c^T [n, m] = b^T a with b's codes a
// column-major [k, n] matrix taken transposed (cuBLASLt's A, op T) and a's a column-major [k, m]
// one taken as it is (its B, op N): the one layout fp8 matmuls take. So cuBLASLt's A scale is
// b's, one per row of its D (per column of c), and its B scale is a's.
lt::Plan Fp8Matmul::make_plan(const Fp8Gemm& gemm) {
  lt::Plan plan;
  check(cublasLtMatmulDescCreate(&plan.description, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set(plan.description, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set(plan.description, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(gemm.b_scales));
  set(plan.description, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(gemm.a_scales));
  set(plan.description, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(gemm.b_inverse));
  set(plan.description, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(gemm.a_inverse));
  set(plan.description, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(gemm.fast_accumulation ? 1 : 0));
  if (gemm.bias != nullptr) {
    set(plan.description, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, library_type(gemm.c_type));
    set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);  // the heuristic reads its alignment
  }
  check(cublasLtMatrixLayoutCreate(&plan.a, code_type(gemm.b_format), gemm.k, gemm.n, gemm.k),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.b, code_type(gemm.a_format), gemm.k, gemm.m, gemm.k),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.c, library_type(gemm.c_type), gemm.n, gemm.m, gemm.n),
        "cublasLtMatrixLayoutCreate");
  lt::choose_algorithm(lt_.handle, plan, lt::workspace_size, alignment_of(gemm.b), alignment_of(gemm.a),
                       alignment_of(gemm.c), gemm.c_type != DataType::float32);
  return plan;
}

bool Fp8Matmul::run(const Fp8Gemm& gemm) {
  // The one layout fp8 matmuls take; the epilogue reads the bias in vectors of 16 bytes.
  if (gemm.transpose_a == Transpose::yes || gemm.transpose_b == Transpose::yes ||
      (gemm.bias != nullptr && alignment_of(gemm.bias) < 16))
    return false;
  const Key key{gemm.m,
                gemm.n,
                gemm.k,
                static_cast<int>(gemm.a_format),
                static_cast<int>(gemm.b_format),
                static_cast<int>(gemm.a_scales),
                static_cast<int>(gemm.b_scales),
                static_cast<int>(gemm.c_type),
                gemm.bias != nullptr,
                gemm.accumulate,
                gemm.fast_accumulation,
                alignment_of(gemm.a),
                alignment_of(gemm.b),
                alignment_of(gemm.c)};
  auto found = plans_.find(key);
  if (found == plans_.end()) found = plans_.emplace(key, make_plan(gemm)).first;
  lt::Plan& plan = found->second;
  if (!plan.usable) return false;
  set(plan.description, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(gemm.b_inverse));
  set(plan.description, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(gemm.a_inverse));
  if (gemm.bias != nullptr) set(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, gemm.bias);
  const float alpha = 1.0f, beta = gemm.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(lt_.handle, plan.description, &alpha, gemm.b, plan.a, gemm.a, plan.b, &beta, gemm.c, plan.c,
                     gemm.c, plan.c, &plan.algorithm, lt_.workspace, lt::workspace_size, lt_.stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    plan.usable = false;  // not for these operands after all
    return false;
  }
  check(status, "cublasLtMatmul (fp8)");
  return true;
}

}  // namespace mlptrain
