// The compute ops of training behind one interface, so a backend for another device sits beside
// the CPU one and the model code never knows which it runs on. Matrices are row-major; pointers
// are device pointers of the backend's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "core/buffer.hpp"
#include "core/data_type.hpp"
#include "core/precision.hpp"
#include "core/builtin_samples.hpp"

namespace mlptrain {

enum class Transpose { no, yes };

// A GEMM dimension that changes from call to call (an expert's share of the routed rows):
// a backend that plans each shape (oneDNN's primitives) plans once for all its values.
enum class Varying { nothing, m, k };

// One GEMM, c = alpha * op(a) op(b) + beta * c, row-major, with op(a) [m, k], op(b) [k, n] and
// c [m, n] (leading dimensions in elements). a and b hold `input` elements: fp32, or bf16 or fp16,
// whose products are exact in fp32. Products are accumulated in fp32 whatever the input; c holds
// `output` elements: fp32, or the input's half type, the fp32 result rounded once to nearest even.
// A `bias` (n elements of the `input` type, for beta = 0 only) is added to every row of the fp32
// accumulator before that rounding: a Linear layer's pre-activation is rounded once (DESIGN.md
// §2.7), not once as a product and again with its bias.
struct Gemm {
  Transpose transpose_a = Transpose::no;
  Transpose transpose_b = Transpose::no;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  float beta = 0.0f;
  void* c = nullptr;
  std::int64_t ldc = 0;
  DataType input = DataType::float32;
  DataType output = DataType::float32;
  const void* bias = nullptr;
  Varying varying = Varying::nothing;
};

// One AdamW update, as torch.optim.AdamW computes it (hyper-parameters in double, as Python
// floats are); `step` counts from 1. The gradients read are multiplied by `grad_scale` first (a
// loss scale's inverse, a clipping coefficient), in fp32.
struct AdamWStep {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  std::int64_t step = 1;
  float grad_scale = 1.0f;
};

// One range of AdamW's flat state: fp32 master weights, their gradients, both moments, and where
// the updated weights go rounded to the compute type (null: nowhere); `counted` says whether its
// gradients count in the squared sum the update returns (a replicated range counts once).
struct AdamWRange {
  float* master = nullptr;
  const void* grads = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  std::size_t count = 0;
  void* compute_copy = nullptr;
  bool counted = true;
};

// How an fp8 GEMM operand [rows, cols] (row-major) is scaled (DESIGN.md §2.7): one scale for all
// of it, one per row, or one per column; its scale count.
enum class Fp8Scaling { tensor, rows, columns };
constexpr std::int64_t fp8_scale_count(Fp8Scaling scaling, std::int64_t rows, std::int64_t cols) {
  return scaling == Fp8Scaling::tensor ? 1 : scaling == Fp8Scaling::rows ? rows : cols;
}

// How a quantized operand's codes lie: as the operand [rows, cols], or transposed [cols, rows]
// (Hopper's fp8 tensor cores take both operands with the summed dimension contiguous).
enum class Fp8CodeLayout { as_is, transposed };

// One coding of an operand for quantize_fp8_pair: its scales (fp8_scale_count of them), their
// amax (fp32, the kernels' memory), where its codes and their inverse scales go.
struct Fp8Coding {
  Fp8Scaling scaling = Fp8Scaling::tensor;
  const float* amax = nullptr;
  std::uint8_t* codes = nullptr;
  float* inverse_scales = nullptr;
};

// c [m, n] (of c_type, row-major, leading dimension n) = sum over k of a[i, k] b[j, k], times
// a's inverse scale of i and b's of j (each one for the whole operand, or one per i or j as
// `a_scales` and `b_scales` say: tensor or rows), + bias[j] (of c_type; may be null), + c[i, j]
// when accumulating: the products of the codes' values exact, summed in fp32, the rest added in
// fp32 and rounded once (DESIGN.md §2.7). a and b are codes of their formats, a stored [m, k]
// (or [k, m] with transpose_a) and b [n, k] (or [k, n] with transpose_b): the summed dimension
// contiguous unless transposed.
// `fast_accumulation` lets Hopper's tensor cores keep their partial sums in their own narrower
// accumulator (CUBLASLT_MATMUL_DESC_FAST_ACCUM); backends that sum in fp32 anyway ignore it.
struct Fp8Gemm {
  std::int64_t m = 0, n = 0, k = 0;
  Transpose transpose_a = Transpose::no;
  Transpose transpose_b = Transpose::no;
  const std::uint8_t* a = nullptr;
  Fp8Format a_format = Fp8Format::e4m3;
  const float* a_inverse = nullptr;
  Fp8Scaling a_scales = Fp8Scaling::tensor;
  const std::uint8_t* b = nullptr;
  Fp8Format b_format = Fp8Format::e4m3;
  const float* b_inverse = nullptr;
  Fp8Scaling b_scales = Fp8Scaling::tensor;
  const void* bias = nullptr;
  void* c = nullptr;
  DataType c_type = DataType::bfloat16;
  bool accumulate = false;
  bool fast_accumulation = false;
  void* workspace = nullptr;  // fp8_gemm_workspace_bytes(m, n, k) of the caller's
};

// The bf16 GEMM an emulated fp8 GEMM runs once the codes are decoded to their values (laid out
// as the codes are, bf16) into fp32 sums [m, n]: op(a) [m, k] is a as stored, or transposed;
// op(b) [k, n] is b transposed, or as stored.
inline Gemm fp8_values_product(const Fp8Gemm& call, const void* a_values, const void* b_values, float* sums) {
  const bool a_transposed = call.transpose_a == Transpose::yes, b_transposed = call.transpose_b == Transpose::yes;
  return {.transpose_a = call.transpose_a, .transpose_b = b_transposed ? Transpose::no : Transpose::yes,
          .m = call.m, .n = call.n, .k = call.k, .a = a_values, .lda = a_transposed ? call.m : call.k,
          .b = b_values, .ldb = b_transposed ? call.n : call.k, .c = sums, .ldc = call.n,
          .input = DataType::bfloat16, .output = DataType::float32};
}

struct CrossEntropyResult {
  double loss_sum = 0;       // sum over rows of -log softmax(logits)[label]
  std::int64_t correct = 0;  // rows whose arg-max (ties to the lower index) is the label
};

// The kernels' element types: tensors of activations, parameters and gradients hold fp32, bf16 or
// fp16 (`type` arguments; see DESIGN.md §2.7). Every computation runs in fp32 on the widened
// elements and a 16-bit result is rounded once, to nearest even. Losses, softmax, the MoE routing
// weights and AdamW's master weights and moments are fp32 always. Each typed kernel has an fp32
// form below it, for callers that hold fp32 tensors.
class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;
  // The libraries and instruction sets behind these kernels, for the start of a run.
  virtual std::string description() const = 0;

  virtual void gemm(const Gemm& gemm) = 0;
  // An fp32 GEMM: c = alpha * op(a) * op(b) + beta * c with op(a) [m, k], op(b) [k, n], c [m, n].
  void gemm(Transpose transpose_a, Transpose transpose_b, std::int64_t m, std::int64_t n,
            std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
            std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    gemm(Gemm{.transpose_a = transpose_a, .transpose_b = transpose_b, .m = m, .n = n, .k = k,
              .alpha = alpha, .a = a, .lda = lda, .b = b, .ldb = ldb, .beta = beta, .c = c,
              .ldc = ldc});
  }

  // destination[i] = source[i] converted between fp32, bf16 and fp16 (to a 16-bit float: rounded
  // to nearest even, subnormals kept, NaN kept NaN; see core/half_float.hpp). Equal types copy.
  virtual void convert(const void* source, DataType source_type, void* destination,
                       DataType destination_type, std::size_t count) = 0;
  // convert, and amax[0] = the largest |destination[i]| as stored: the loss's gradient rounded
  // to the param type, the last layer's fp8 d(pre), its amax taken where it is made (§2.7). The
  // default runs the two passes.
  virtual void convert_amax(const void* source, DataType source_type, void* destination, DataType destination_type,
                            std::size_t count, float* amax) {
    convert(source, source_type, destination, destination_type, count);
    absolute_max(destination, destination_type, 1, static_cast<std::int64_t>(count), Fp8Scaling::tensor, amax);
  }

  // activated = GELU(pre) (exact, erf form, in fp32 on the stored pre-activation), both of `type`.
  virtual void gelu_forward(const void* pre, void* activated, std::int64_t rows, std::int64_t cols,
                            DataType type) = 0;
  // data[r, :] += bias, both of `type`.
  virtual void bias_add(void* data, const void* bias, std::int64_t rows, std::int64_t cols, DataType type) = 0;
  // grad_pre = grad_activated * GELU'(pre) (all of `type`); bias_grad (of `bias_grad_type`) = (or
  // +=) the column sums of grad_pre, summed in fp32 and rounded once into it.
  virtual void gelu_backward(const void* grad_activated, const void* pre, void* grad_pre, DataType type,
                             void* bias_grad, DataType bias_grad_type, bool accumulate, std::int64_t rows,
                             std::int64_t cols) = 0;
  // gelu_forward and gelu_backward that also take the amax of what they write (amax[0] = the
  // largest |activated| or |grad_pre| as stored): an fp8 operand's tensorwise amax taken where the
  // operand is made (§2.7), equal to absolute_max's over it. The defaults run the two passes.
  virtual void gelu_forward_amax(const void* pre, void* activated, std::int64_t rows, std::int64_t cols,
                                 DataType type, float* amax) {
    gelu_forward(pre, activated, rows, cols, type);
    absolute_max(activated, type, rows, cols, Fp8Scaling::tensor, amax);
  }
  virtual void gelu_backward_amax(const void* grad_activated, const void* pre, void* grad_pre, DataType type,
                                  void* bias_grad, DataType bias_grad_type, bool accumulate, std::int64_t rows,
                                  std::int64_t cols, float* amax) {
    gelu_backward(grad_activated, pre, grad_pre, type, bias_grad, bias_grad_type, accumulate, rows, cols);
    absolute_max(grad_pre, type, rows, cols, Fp8Scaling::tensor, amax);
  }
  // sums (of `sums_type`) = (or +=) the column sums of data (of `type`), summed in fp32.
  virtual void column_sums(const void* data, DataType type, void* sums, DataType sums_type, bool accumulate,
                           std::int64_t rows, std::int64_t cols) = 0;

  // Returns the sum of squared errors; grad (if not null) = grad_scale * 2 (prediction - target).
  virtual double mse(const float* prediction, const float* target, float* grad, std::int64_t rows,
                     std::int64_t cols, float grad_scale) = 0;
  // Softmax cross-entropy over rows; grad (if not null) = grad_scale * (softmax - one_hot).
  virtual CrossEntropyResult cross_entropy(const float* logits, const std::int32_t* labels,
                                           float* grad, std::int64_t rows, std::int64_t cols,
                                           float grad_scale) = 0;

  // Row-wise softmax in place (max-subtracted, sums in double).
  virtual void softmax_rows(float* data, std::int64_t rows, std::int64_t cols) = 0;
  // grad_logits = p * (grad_p - sum(p * grad_p)) row by row: the softmax's backward (the two
  // gradients may be one buffer).
  virtual void softmax_backward_rows(const float* probabilities, const float* grad_probabilities,
                                     float* grad_logits, std::int64_t rows, std::int64_t cols) = 0;
  // The row moves of MoE dispatch and combine (scales may be null: 1).
  // destination[i, :] = scales[i] * source[indices[i], :] for i < rows (both of `type`).
  virtual void gather_rows(const void* source, const std::int32_t* indices, const float* scales,
                           void* destination, std::int64_t rows, std::int64_t cols, DataType type) = 0;
  // destination[t, :] for t < tokens = the sum over token t's rows r (rows[row_begin[t]] up to
  // rows[row_begin[t + 1] - 1]) of scales[r] * source[r, :], in fp32 in that order (begun with
  // the first term, each further one added by an FMA), stored as `destination_type` (rounded
  // once; zeros for a token without rows): MoE's combine, each token's row written once.
  virtual void sum_token_rows(const void* source, DataType source_type, const std::int32_t* row_begin,
                              const std::int32_t* rows, const float* scales, void* destination,
                              DataType destination_type, std::int64_t tokens, std::int64_t cols) = 0;
  // dots[i] = <a[indices[i], :], b[i, :]> for i < rows, a and b of `type`.
  virtual void row_dots(const void* a, const std::int32_t* indices, const void* b, float* dots,
                        std::int64_t rows, std::int64_t cols, DataType type) = 0;

  // Built-in samples made where the kernels compute (core/builtin_samples.hpp), the CPU's bit for
  // bit: for each of `count` stream indices its inputs row and its targets (teacher) or label
  // (mixture); an output that is null is not made. The tables `samples` points at, the indices
  // and the outputs are the device's memory.
  virtual void generate_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices,
                                std::int64_t count, float* inputs, float* targets, std::int32_t* labels) = 0;

  // AdamW over one flat range of fp32 master weights, from gradients of `grads_type`; when
  // `compute_copy` is given, it receives the updated weights rounded to `compute_type`. Returns
  // the sum of squares of the (scaled) gradients (the step's norm comes free).
  virtual double adamw(float* master, const void* grads, DataType grads_type, float* exp_avg,
                       float* exp_avg_sq, std::size_t count, const AdamWStep& step, void* compute_copy,
                       DataType compute_type) = 0;
  // AdamW over every range of a step (one launch on a GPU, where one a range would wait for the
  // device each time); returns the squared (scaled) gradients of the counted ranges.
  virtual double adamw(std::span<const AdamWRange> ranges, DataType grads_type, const AdamWStep& step,
                       DataType compute_type) {
    double sum = 0;
    for (const AdamWRange& range : ranges) {
      const double range_sum = adamw(range.master, range.grads, grads_type, range.exp_avg, range.exp_avg_sq,
                                     range.count, step, range.compute_copy, compute_type);
      if (range.counted) sum += range_sum;
    }
    return sum;
  }

  // fp8 operands (§2.7; core/fp8.hpp): amax (fp32, fp8_scale_count elements) = the absolute
  // maximum of `data` ([rows, cols] of `type`) over each scale's elements.
  virtual void absolute_max(const void* /*data*/, DataType /*type*/, std::int64_t /*rows*/, std::int64_t /*cols*/,
                            Fp8Scaling /*scaling*/, float* /*amax*/) {
    unsupported("fp8 operands");
  }
  // codes (one byte an element, laid out as `layout` says) = fp8::encode(fp8::round_to(x s,
  // format)) with s = fp8::scale_for(amax of x's scale, format); inverse_scales = 1 / s (powers
  // of two: exact), one per scale of `scaling`.
  virtual void quantize_fp8(const void* /*data*/, DataType /*type*/, std::int64_t /*rows*/, std::int64_t /*cols*/,
                            Fp8Scaling /*scaling*/, const float* /*amax*/, Fp8Format /*format*/,
                            Fp8CodeLayout /*layout*/, std::uint8_t* /*codes*/, float* /*inverse_scales*/) {
    unsupported("fp8 operands");
  }
  // An operand two products read, coded for both in one pass over it (Transformer Engine's
  // cast-transpose): `summed_columns` as quantize_fp8 codes it as_is, `summed_rows` as it codes
  // it in `summed_rows_layout` (the weight for the forward and the input gradient; d(pre) for the
  // input and the weight gradients). The default runs the two passes.
  virtual void quantize_fp8_pair(const void* data, DataType type, std::int64_t rows, std::int64_t cols,
                                 Fp8Format format, const Fp8Coding& summed_columns, const Fp8Coding& summed_rows,
                                 Fp8CodeLayout summed_rows_layout) {
    quantize_fp8(data, type, rows, cols, summed_columns.scaling, summed_columns.amax, format, Fp8CodeLayout::as_is,
                 summed_columns.codes, summed_columns.inverse_scales);
    quantize_fp8(data, type, rows, cols, summed_rows.scaling, summed_rows.amax, format, summed_rows_layout,
                 summed_rows.codes, summed_rows.inverse_scales);
  }
  // How an operand whose rows a product sums over is best coded for this backend's fp8 GEMM:
  // transposed (the summed dimension contiguous, as tensor cores take it; the default) or as it
  // is (a GEMM that reads a transposed operand through its strides).
  virtual Fp8CodeLayout fp8_summed_rows_layout() const { return Fp8CodeLayout::transposed; }
  // The fp8 GEMM of two quantized operands (Fp8Gemm); its workspace's bytes, where the backend
  // wants one from the caller's allocator.
  virtual void fp8_gemm(const Fp8Gemm& /*gemm*/) { unsupported("fp8 products"); }
  virtual std::size_t fp8_gemm_workspace_bytes(std::int64_t /*m*/, std::int64_t /*n*/, std::int64_t /*k*/) const {
    return 0;
  }

  // A tensor moved in fp8 (ZeRO-3's gathers, §2.7), with the scale s = fp8::scale_for(*amax,
  // format): codes[i] = fp8::encode(round_to(values[i] s)), and back, values[i] = decode(codes[i])
  // / s rounded to `type` (exact for bf16 and fp32).
  virtual void encode_fp8(const void* /*values*/, DataType /*type*/, std::size_t /*count*/, const float* /*amax*/,
                          Fp8Format /*format*/, std::uint8_t* /*codes*/) {
    unsupported("fp8 transfers");
  }
  virtual void decode_fp8(const std::uint8_t* /*codes*/, std::size_t /*count*/, const float* /*amax*/,
                          Fp8Format /*format*/, void* /*values*/, DataType /*type*/) {
    unsupported("fp8 transfers");
  }

  virtual double sum_of_squares(const void* data, DataType type, std::size_t count) = 0;
  virtual void scale(void* data, DataType type, std::size_t count, float factor) = 0;
  virtual void fill(void* data, DataType type, std::size_t count, float value) = 0;
  // destination = (or +=, rounded once) source, both of `type`.
  virtual void add(void* destination, const void* source, DataType type, std::size_t count) = 0;
  void copy(void* destination, const void* source, DataType type, std::size_t count) {
    convert(source, type, destination, type, count);
  }

  // The fp32 forms.
  void gelu_forward(const float* pre, float* activated, std::int64_t rows, std::int64_t cols) {
    gelu_forward(pre, activated, rows, cols, DataType::float32);
  }
  void bias_add(float* data, const float* bias, std::int64_t rows, std::int64_t cols) {
    bias_add(data, bias, rows, cols, DataType::float32);
  }
  void gelu_backward(const float* grad_activated, const float* pre, float* grad_pre, float* bias_grad,
                     bool accumulate, std::int64_t rows, std::int64_t cols) {
    gelu_backward(grad_activated, pre, grad_pre, DataType::float32, bias_grad, DataType::float32, accumulate,
                  rows, cols);
  }
  void column_sums(const float* data, float* sums, bool accumulate, std::int64_t rows, std::int64_t cols) {
    column_sums(data, DataType::float32, sums, DataType::float32, accumulate, rows, cols);
  }
  void gather_rows(const float* source, const std::int32_t* indices, const float* scales, float* destination,
                   std::int64_t rows, std::int64_t cols) {
    gather_rows(source, indices, scales, destination, rows, cols, DataType::float32);
  }
  void sum_token_rows(const float* source, const std::int32_t* row_begin, const std::int32_t* rows,
                      const float* scales, float* destination, std::int64_t tokens, std::int64_t cols) {
    sum_token_rows(source, DataType::float32, row_begin, rows, scales, destination, DataType::float32, tokens, cols);
  }
  void row_dots(const float* a, const std::int32_t* indices, const float* b, float* dots, std::int64_t rows,
                std::int64_t cols) {
    row_dots(a, indices, b, dots, rows, cols, DataType::float32);
  }
  double adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
               const AdamWStep& step) {
    return adamw(params, grads, DataType::float32, exp_avg, exp_avg_sq, count, step, nullptr, DataType::float32);
  }
  double sum_of_squares(const float* data, std::size_t count) {
    return sum_of_squares(data, DataType::float32, count);
  }
  void scale(float* data, std::size_t count, float factor) { scale(data, DataType::float32, count, factor); }
  void fill(float* data, std::size_t count, float value) { fill(data, DataType::float32, count, value); }
  void copy(float* destination, const float* source, std::size_t count) {
    copy(destination, source, DataType::float32, count);
  }
  void add(float* destination, const float* source, std::size_t count) {
    add(destination, source, DataType::float32, count);
  }

 protected:
  // What a backend without an op says when asked for it (its options refuse such runs first).
  [[noreturn]] void unsupported(const char* what) const {
    throw std::logic_error(std::string(what) + ": no kernels for them on this device");
  }
};

std::unique_ptr<Kernels> make_cpu_kernels();

// Sets how many threads the CPU kernels' GEMMs use (OpenMP, as oneDNN is built here) on the
// calling thread, which runs them, unless OMP_NUM_THREADS is set: the user's choice wins.
// Returns the count in effect.
int set_cpu_gemm_threads(int threads);

}  // namespace mlptrain
