// oneDNN's matmul timed directly (see library_gemm.hpp).
#include "bench/library_gemm.hpp"

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/timer.hpp"

namespace mlptrain {

std::optional<LibraryGemmTime> time_library_gemms(const std::vector<Gemm>& gemms, int repeats,
                                                  const std::function<void()>& start_together) {
  using dnnl::memory;
  const auto type = [](DataType element) {
    return element == DataType::bfloat16 ? memory::data_type::bf16
           : element == DataType::float16 ? memory::data_type::f16
                                          : memory::data_type::f32;
  };
  const auto strides = [](Transpose transpose, std::int64_t leading) {
    return transpose == Transpose::yes ? memory::dims{1, leading} : memory::dims{leading, 1};
  };
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  struct Prepared {
    dnnl::matmul matmul;
    memory a, b, c, bias;
  };
  std::vector<Prepared> prepared;
  std::string implementation;
  for (const Gemm& gemm : gemms) {
    const memory::desc a({gemm.m, gemm.k}, type(gemm.input), strides(gemm.transpose_a, gemm.lda));
    const memory::desc b({gemm.k, gemm.n}, type(gemm.input), strides(gemm.transpose_b, gemm.ldb));
    const memory::desc c({gemm.m, gemm.n}, type(gemm.output), strides(Transpose::no, gemm.ldc));
    // A bias as the trainer's forward adds it: a [1, n] row of the input type.
    const memory::desc bias = gemm.bias != nullptr ? memory::desc({1, gemm.n}, type(gemm.input), memory::dims{gemm.n, 1})
                                                   : memory::desc();
    dnnl::matmul::primitive_desc description;
    try {
      description = dnnl::matmul::primitive_desc(
          gemm.bias != nullptr ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), engine);
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
    if (implementation.empty()) implementation = description.impl_info_str();
    prepared.push_back({dnnl::matmul(description), memory(a, engine, const_cast<void*>(gemm.a)),
                        memory(b, engine, const_cast<void*>(gemm.b)), memory(c, engine, gemm.c),
                        gemm.bias != nullptr ? memory(bias, engine, const_cast<void*>(gemm.bias)) : memory()});
  }
  const auto run = [&] {
    for (Prepared& gemm : prepared) {
      if (gemm.bias)
        gemm.matmul.execute(stream, {{DNNL_ARG_SRC, gemm.a}, {DNNL_ARG_WEIGHTS, gemm.b}, {DNNL_ARG_BIAS, gemm.bias},
                                     {DNNL_ARG_DST, gemm.c}});
      else
        gemm.matmul.execute(stream, {{DNNL_ARG_SRC, gemm.a}, {DNNL_ARG_WEIGHTS, gemm.b}, {DNNL_ARG_DST, gemm.c}});
      stream.wait();
    }
  };
  run();  // warm up
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    start_together();
    const double start = now_ms();
    run();
    best = std::min(best, now_ms() - start);
  }
  return LibraryGemmTime{best, implementation};
}

}  // namespace mlptrain
