// GEMMs through oneDNN (see onednn_matmul.hpp).
#include "kernels/cpu/onednn_matmul.hpp"

#include <fmt/format.h>

#include <functional>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/half_float.hpp"

namespace mlptrain {

namespace {

using dnnl::memory;

memory::data_type library_type(DataType type) {
  switch (type) {
    case DataType::float32: return memory::data_type::f32;
    case DataType::bfloat16: return memory::data_type::bf16;
    case DataType::float16: return memory::data_type::f16;
    default: return memory::data_type::undef;
  }
}

// A row-major matrix [rows, columns] with leading dimension `leading`, read transposed or not:
// the transpose of a row-major matrix is the column-major view of the same memory.
memory::desc matrix(std::int64_t rows, std::int64_t columns, std::int64_t leading, Transpose transpose,
                    DataType type) {
  const memory::dims strides = transpose == Transpose::yes ? memory::dims{1, leading} : memory::dims{leading, 1};
  return memory::desc({rows, columns}, library_type(type), strides);
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "isa " + std::to_string(static_cast<int>(isa));
  }
}

// Widens `count` elements of a matrix's memory to fp32 (a, b and c are small next to the GEMM).
void widen(const void* source, DataType type, std::size_t count, std::vector<float>& into) {
  into.resize(count);
  const auto* bits = static_cast<const std::uint16_t*>(source);
  for (std::size_t i = 0; i < count; ++i)
    into[i] = type == DataType::float16 ? float16_to_float(bits[i]) : bfloat16_to_float(bits[i]);
}

// Elements a row-major matrix of `rows` rows with leading dimension `leading` spans.
std::size_t span(std::int64_t rows, std::int64_t columns, std::int64_t leading) {
  return rows == 0 ? 0 : static_cast<std::size_t>((rows - 1) * leading + columns);
}

}  // namespace

struct OneDnnMatmul::Library {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

struct OneDnnMatmul::Primitive {
  dnnl::matmul matmul;
  memory::desc a, b, c, bias;
  std::string implementation;
};

std::size_t OneDnnMatmul::ProblemHash::operator()(const Problem& problem) const {
  std::size_t hash = 0;
  const auto mix = [&hash](std::size_t value) { hash ^= value + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2); };
  for (std::int64_t value : {problem.m, problem.n, problem.k, problem.lda, problem.ldb, problem.ldc})
    mix(std::hash<std::int64_t>{}(value));
  mix(static_cast<std::size_t>(problem.transpose_a) << 1 | static_cast<std::size_t>(problem.transpose_b));
  mix(static_cast<std::size_t>(problem.input) << 8 | static_cast<std::size_t>(problem.output));
  mix(std::hash<float>{}(problem.alpha));
  mix(std::hash<float>{}(problem.beta));
  mix(std::hash<bool>{}(problem.bias));
  return hash;
}

OneDnnMatmul::OneDnnMatmul() : library_(std::make_unique<Library>()) {}
OneDnnMatmul::~OneDnnMatmul() = default;

OneDnnMatmul::Primitive* OneDnnMatmul::find(const Problem& problem) {
  if (const auto found = cache_.find(problem); found != cache_.end()) {
    order_.splice(order_.begin(), order_, found->second.second);
    return found->second.first.get();
  }
  std::unique_ptr<Primitive> primitive;
  if (library_type(problem.input) != memory::data_type::undef &&
      library_type(problem.output) != memory::data_type::undef) {
    const memory::desc a = matrix(problem.m, problem.k, problem.lda, problem.transpose_a, problem.input);
    const memory::desc b = matrix(problem.k, problem.n, problem.ldb, problem.transpose_b, problem.input);
    const memory::desc c = matrix(problem.m, problem.n, problem.ldc, Transpose::no, problem.output);
    // The bias joins the fp32 accumulator (a [1, n] row broadcast over the rows) before the
    // output is converted, so a half output is rounded once.
    const memory::desc bias = problem.bias ? matrix(1, problem.n, problem.n, Transpose::no, problem.input)
                                           : memory::desc();
    dnnl::primitive_attr attributes;
    if (problem.alpha != 1.0f) attributes.set_output_scales(0, {problem.alpha});
    if (problem.beta != 0.0f) {
      dnnl::post_ops accumulate;
      accumulate.append_sum(problem.beta);
      attributes.set_post_ops(accumulate);
    }
    try {
      const dnnl::matmul::primitive_desc description(
          problem.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), attributes, library_->engine);
      primitive = std::make_unique<Primitive>(
          Primitive{dnnl::matmul(description), a, b, c, bias, description.impl_info_str()});
      ++created_;
    } catch (const dnnl::error&) {
      // No implementation for these element types here: run_widened takes over (cached too).
    }
  }
  if (order_.size() == capacity) {
    cache_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(problem);
  return cache_.emplace(problem, std::pair{std::move(primitive), order_.begin()}).first->second.first.get();
}

void OneDnnMatmul::run(const Gemm& gemm) {
  if (gemm.bias != nullptr && gemm.beta != 0.0f)
    throw std::logic_error("a GEMM's bias is for beta = 0 (it would be added to the old output too)");
  if (gemm.varying == Varying::m && gemm.m >= 2 * row_block) {
    run_blocks(gemm);
  } else {
    run_one(gemm);
  }
}

void OneDnnMatmul::run_blocks(const Gemm& gemm) {
  // Blocks of row_block rows, the last one taking the rest too (row_block to 2 row_block - 1
  // rows): no short GEMM at the end.
  for (std::int64_t first = 0; first < gemm.m;) {
    Gemm block = gemm;
    block.m = gemm.m - first < 2 * row_block ? gemm.m - first : row_block;
    // Row `first` of op(a): a row of a, or a column of a read transposed.
    const std::int64_t a_offset = gemm.transpose_a == Transpose::yes ? first : first * gemm.lda;
    block.a = advance(gemm.a, static_cast<std::size_t>(a_offset), gemm.input);
    block.c = advance(gemm.c, static_cast<std::size_t>(first * gemm.ldc), gemm.output);
    run_one(block);
    first += block.m;
  }
}

OneDnnMatmul::Problem OneDnnMatmul::problem_of(const Gemm& gemm) {
  return {gemm.transpose_a, gemm.transpose_b, gemm.m, gemm.n, gemm.varying == Varying::k ? DNNL_RUNTIME_DIM_VAL : gemm.k,
          gemm.lda, gemm.ldb, gemm.ldc, gemm.input, gemm.output, gemm.alpha, gemm.beta, gemm.bias != nullptr};
}

std::string OneDnnMatmul::implementation_of(const Gemm& gemm) {
  const Primitive* primitive = find(problem_of(gemm));
  return primitive != nullptr ? primitive->implementation : "widened";
}

void OneDnnMatmul::run_one(const Gemm& gemm) {
  const bool runtime_k = gemm.varying == Varying::k;
  Primitive* primitive = find(problem_of(gemm));
  if (primitive == nullptr && runtime_k) {  // no run-time k for these types: the exact shape
    Gemm exact = gemm;
    exact.varying = Varying::nothing;
    run_one(exact);
    return;
  }
  if (primitive == nullptr) {
    run_widened(gemm);
    return;
  }
  // The library takes non-const handles; it only reads a and b. A k given at run time is given
  // by the operands' own descriptions.
  memory a(runtime_k ? matrix(gemm.m, gemm.k, gemm.lda, gemm.transpose_a, gemm.input) : primitive->a,
           library_->engine, const_cast<void*>(gemm.a));
  memory b(runtime_k ? matrix(gemm.k, gemm.n, gemm.ldb, gemm.transpose_b, gemm.input) : primitive->b,
           library_->engine, const_cast<void*>(gemm.b));
  memory c(primitive->c, library_->engine, gemm.c);
  std::unordered_map<int, memory> arguments{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (gemm.bias != nullptr)
    arguments.emplace(DNNL_ARG_BIAS, memory(primitive->bias, library_->engine, const_cast<void*>(gemm.bias)));
  primitive->matmul.execute(library_->stream, arguments);
  library_->stream.wait();
}

void OneDnnMatmul::run_widened(const Gemm& gemm) {
  Gemm widened = gemm;
  const auto [a_rows, a_columns] = gemm.transpose_a == Transpose::yes ? std::pair{gemm.k, gemm.m} : std::pair{gemm.m, gemm.k};
  const auto [b_rows, b_columns] = gemm.transpose_b == Transpose::yes ? std::pair{gemm.n, gemm.k} : std::pair{gemm.k, gemm.n};
  if (gemm.input != DataType::float32) {
    widen(gemm.a, gemm.input, span(a_rows, a_columns, gemm.lda), widened_a_);
    widen(gemm.b, gemm.input, span(b_rows, b_columns, gemm.ldb), widened_b_);
    widened.a = widened_a_.data();
    widened.b = widened_b_.data();
    if (gemm.bias != nullptr) {
      widen(gemm.bias, gemm.input, static_cast<std::size_t>(gemm.n), widened_bias_);
      widened.bias = widened_bias_.data();
    }
    widened.input = DataType::float32;
  }
  const std::size_t c_elements = span(gemm.m, gemm.n, gemm.ldc);
  if (gemm.output != DataType::float32) {
    if (gemm.beta != 0.0f) {
      widen(gemm.c, gemm.output, c_elements, widened_c_);
    } else {
      widened_c_.assign(c_elements, 0.0f);
    }
    widened.c = widened_c_.data();
    widened.output = DataType::float32;
  }
  if (widened.input == gemm.input && widened.output == gemm.output)
    throw std::logic_error(fmt::format("oneDNN has no matmul for {} inputs and {} output here",
                                       data_type_name(gemm.input), data_type_name(gemm.output)));
  run(widened);
  if (gemm.output == DataType::float32) return;
  auto* bits = static_cast<std::uint16_t*>(gemm.c);
  for (std::int64_t row = 0; row < gemm.m; ++row)
    for (std::int64_t column = 0; column < gemm.n; ++column) {
      const std::size_t at = static_cast<std::size_t>(row * gemm.ldc + column);
      bits[at] = gemm.output == DataType::float16 ? round_to_float16(widened_c_[at])
                                                  : round_to_bfloat16(widened_c_[at]);
    }
}

std::string OneDnnMatmul::implementation(DataType input) const {
  // A probe of the layer shapes the trainer runs: the kernel the library picks for them.
  const memory::desc a = matrix(64, 64, 64, Transpose::no, input);
  const memory::desc c = matrix(64, 64, 64, Transpose::no, DataType::float32);
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), library_->engine).impl_info_str();
  } catch (const dnnl::error&) {
    return "widened to fp32";
  }
}

std::string OneDnnMatmul::description() const {
  const dnnl_version_t* version = dnnl_version();
  return fmt::format("oneDNN {}.{}.{} matmul on {}: fp32 {}, bf16 {}, fp16 {}", version->major,
                     version->minor, version->patch, isa_name(dnnl::get_effective_cpu_isa()),
                     implementation(DataType::float32), implementation(DataType::bfloat16),
                     implementation(DataType::float16));
}

}  // namespace mlptrain
