// The CPU backend's GEMMs through oneDNN's matmul primitive, which picks its kernel from the
// instruction sets the CPU reports at run time (AVX-512, AVX512_BF16, AMX, ...) rather than from a
// table of CPU models. A primitive is made for one exact problem (shape, strides, element types,
// alpha, beta, bias or none) and making one costs far more than running a small GEMM, so primitives are cached
// by problem, least recently used first out (MoE experts see a new row count with each routing).
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

  // Cached primitives, and how many are kept at most.
  std::size_t cached() const { return order_.size(); }
  static constexpr std::size_t capacity = 1024;

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
  void run_widened(const Gemm& gemm);
  std::string implementation(DataType input) const;

  struct Library;
  std::unique_ptr<Library> library_;
  std::unordered_map<Problem, std::pair<std::unique_ptr<Primitive>, Order::iterator>, ProblemHash> cache_;
  Order order_;  // most recently used first
  std::vector<float> widened_a_, widened_b_, widened_c_, widened_bias_;
};

}  // namespace mlptrain
