// The CPU backend's GEMMs through oneDNN's matmul primitive, which picks its kernel from the
// instruction sets the CPU reports at run time (AVX-512, AVX512_BF16, AMX, ...) rather than from a
// table of CPU models. A primitive is made for one exact problem (shape, strides, element types,
// alpha, beta, bias or none) and making one (0.2-0.3 ms) costs more than running a small GEMM, so
// primitives are cached by problem, least recently used first out. MoE experts see a new row
// count with each routing: a varying m of 2 row_block rows or more runs in blocks of row_block
// rows, the last taking the rest (so at most 2 row_block - 1 shapes, each made once, however
// large the batch), a varying k through one primitive whose k is given at run time (oneDNN's
// gemm:jit, as fast here for the weight gradient's shape; for a varying m it was 10-30 % slower
// than exact shapes).
// Element types the library cannot multiply on this CPU (fp16 without AVX512_FP16) are widened to
// fp32 first: a product of two 16-bit floats is exact in fp32, so the result is the same GEMM
// with fp32 accumulation.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/kernels.hpp"

namespace mlptrain {

class OneDnnMatmul {
 public:
  OneDnnMatmul();
  ~OneDnnMatmul();
  OneDnnMatmul(const OneDnnMatmul&) = delete;
  OneDnnMatmul& operator=(const OneDnnMatmul&) = delete;

  void run(const Gemm& gemm);
  // "oneDNN 2.6.3 (avx512_core_bf16), fp32 brg:avx512_core, bf16 brg:avx512_core_bf16, ..."
  std::string description() const;
  // The library's kernel for `gemm` (one of a fixed shape), as oneDNN names it: on some CPUs it
  // depends on the row count (AMX for many rows, AVX-512 for one), and with it the order of the
  // fp32 sums. "widened" where the library has none for the element types.
  std::string implementation_of(const Gemm& gemm);

  // Cached primitives, how many are kept at most, and how many were made in all.
  std::size_t cached() const { return order_.size(); }
  static constexpr std::size_t capacity = 1024;
  std::size_t created() const { return created_; }
  // Rows of a block of a varying m (blocks of 128 rows cost 2-4 % over one GEMM of all of them).
  static constexpr std::int64_t row_block = 128;

 private:
  struct Problem {
    Transpose transpose_a, transpose_b;
    std::int64_t m, n, k, lda, ldb, ldc;
    DataType input, output;
    float alpha, beta;
    bool bias;
    bool operator==(const Problem&) const = default;
  };
  struct ProblemHash {
    std::size_t operator()(const Problem& problem) const;
  };
  struct Primitive;  // oneDNN's objects, kept out of this header
  using Order = std::list<Problem>;

  // The cached primitive of `problem`, made now if needed; null when the library has none for
  // its element types on this CPU.
  Primitive* find(const Problem& problem);
  static Problem problem_of(const Gemm& gemm);
  void run_blocks(const Gemm& gemm);
  void run_one(const Gemm& gemm);
  void run_widened(const Gemm& gemm);
  std::string implementation(DataType input) const;

  struct Library;
  std::unique_ptr<Library> library_;
  std::unordered_map<Problem, std::pair<std::unique_ptr<Primitive>, Order::iterator>, ProblemHash> cache_;
  Order order_;  // most recently used first
  std::size_t created_ = 0;
  std::vector<float> widened_a_, widened_b_, widened_c_, widened_bias_;
};

}  // namespace mlptrain
