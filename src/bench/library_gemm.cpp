// oneDNN's matmul timed directly (see library_gemm.hpp).
#include "bench/library_gemm.hpp"

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/timer.hpp"

namespace mlptrain {

std::optional<LibraryGemmTime> time_library_gemm(const Gemm& gemm, int repeats) {
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
  const memory::desc a({gemm.m, gemm.k}, type(gemm.input), strides(gemm.transpose_a, gemm.lda));
  const memory::desc b({gemm.k, gemm.n}, type(gemm.input), strides(gemm.transpose_b, gemm.ldb));
  const memory::desc c({gemm.m, gemm.n}, type(gemm.output), strides(Transpose::no, gemm.ldc));
  dnnl::matmul::primitive_desc description;
  try {
    description = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
  const dnnl::matmul matmul(description);
  memory a_memory(a, engine, const_cast<void*>(gemm.a)), b_memory(b, engine, const_cast<void*>(gemm.b)),
      c_memory(c, engine, gemm.c);
  const auto run = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
    stream.wait();
  };
  run();  // warm up
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const double start = now_ms();
    run();
    best = std::min(best, now_ms() - start);
  }
  return LibraryGemmTime{best, description.impl_info_str()};
}

}  // namespace mlptrain
