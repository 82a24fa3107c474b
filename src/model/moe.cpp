// The MoE layer's dispatch, experts and combine (see moe.hpp; the routing is in moe_routing.cpp).
#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace mlptrain {

MoeLayer::MoeLayer(const ParameterStore& store, const LayerSpec& spec, const std::string& base_path,
                   const MoeSettings& settings)
    : spec_(spec), settings_(settings), precision_(store.precision()) {
  const ParameterTensor& router = store.tensor(base_path + "/router/weight");
  const ParameterTensor& weight = store.tensor(base_path + "/experts/weight");
  const ParameterTensor& bias = store.tensor(base_path + "/experts/bias");
  first_expert_ = static_cast<int>(weight.local_start[0]);
  local_experts_ = static_cast<int>(weight.local_shape[0]);
  const std::size_t unit = store.unit_range(spec.index).offset;
  router_at_ = router.offset - unit;
  weight_at_ = weight.offset - unit;
  bias_at_ = bias.offset - unit;
  store_ = bind(store.value_at(unit), store.grad_at(unit));
}

MoeParameters MoeLayer::bind(void* unit_values, void* unit_grads) const {
  const DataType value = precision_.param, grad = precision_.reduce;
  return {.router = advance(unit_values, router_at_, value),
          .router_grad = advance(unit_grads, router_at_, grad),
          .weight = advance(unit_values, weight_at_, value),
          .weight_grad = advance(unit_grads, weight_at_, grad),
          .bias = advance(unit_values, bias_at_, value),
          .bias_grad = advance(unit_grads, bias_at_, grad)};
}

namespace {

std::vector<std::size_t> times(const std::vector<std::size_t>& rows, std::int64_t width) {
  std::vector<std::size_t> result;
  for (std::size_t count : rows) result.push_back(count * static_cast<std::size_t>(width));
  return result;
}

template <typename T>
Buffer upload(Allocator& allocator, const std::vector<T>& values, MemoryState state = MemoryState::activations) {
  Buffer buffer = allocator.allocate(state, values.size() * sizeof(T));
  allocator.copy_to_device(buffer.as<void>(), values.data(), buffer.bytes());
  return buffer;
}

// Rows of `type` in packed order (grouped by source rank on the expert side) sent to the other
// side of the exchange; `rows_out` and `rows_in` per rank. With one expert rank, the rows stay.
Buffer exchange(const MoeLayer::Pass& pass, Buffer rows, const std::vector<std::size_t>& rows_out,
                const std::vector<std::size_t>& rows_in, std::int64_t width, DataType type, MemoryState state) {
  if (pass.exchange.expert_ranks() == 1) return rows;
  const auto total = static_cast<std::size_t>(std::accumulate(rows_in.begin(), rows_in.end(), std::size_t{0}));
  Buffer received = pass.allocator.allocate_elements(state, total * static_cast<std::size_t>(width), type);
  pass.exchange.exchange_rows(rows.as<void>(), times(rows_out, width), received.as<void>(), times(rows_in, width),
                              type);
  return received;
}

// Reorders rows by `order` (int32, destination row i = source row order[i]); none needed when
// empty.
Buffer reorder(const MoeLayer::Pass& pass, Buffer rows, const Buffer& order, std::int64_t width, DataType type,
               MemoryState state) {
  if (order.empty()) return rows;
  const auto count = static_cast<std::int64_t>(order.bytes() / sizeof(std::int32_t));
  Buffer result = pass.allocator.allocate_elements(state, static_cast<std::size_t>(count * width), type);
  pass.kernels.gather_rows(rows.as<void>(), order.as<std::int32_t>(), nullptr, result.as<void>(), count, width, type);
  return result;
}

// Where the fp32 sums of rows bound for `output` (of `type`) are formed: the output itself when
// it is fp32, else a workspace buffer (`sums`) that round_sums rounds once into the output.
float* fp32_sums(const MoeLayer::Pass& pass, DataType type, void* output, std::size_t count, Buffer& sums) {
  if (type == DataType::float32) return static_cast<float*>(output);
  sums = pass.allocator.allocate_floats(MemoryState::workspace, count);
  return sums.floats();
}
void round_sums(const MoeLayer::Pass& pass, const Buffer& sums, void* output, DataType type, std::size_t count) {
  if (!sums.empty()) pass.kernels.convert(sums.floats(), DataType::float32, output, type, count);
}

// output [tokens, width] (of `output_type`) = the sum over each token's kept assignments of scale
// x source row, in fp32, rounded once, the rows taken from the routing's per-token lists.
void combine(const MoeLayer::Pass& pass, const Buffer& source, DataType type, const MoeRouting& routing,
             const float* scales, void* output, DataType output_type, std::int64_t tokens, std::int64_t width) {
  const Buffer begin_table = upload(pass.allocator, routing.token_row_begin, MemoryState::workspace);
  const Buffer rows_table = upload(pass.allocator, routing.token_rows, MemoryState::workspace);
  pass.kernels.sum_token_rows(source.as<void>(), type, begin_table.as<std::int32_t>(), rows_table.as<std::int32_t>(),
                              scales, output, output_type, tokens, width);
}

}  // namespace

void MoeLayer::forward(const Pass& pass, const void* input, std::int64_t rows, void* output,
                       MoeActivations& saved, MoeStatistics* statistics) const {
  Kernels& kernels = pass.kernels;
  Allocator& allocator = pass.allocator;
  const MoeParameters& parameters = pass.parameters != nullptr ? *pass.parameters : store_;
  const std::int64_t hidden = spec_.out_features, experts = spec_.experts;
  const DataType type = precision_.param;
  const auto rows_of = [&](MemoryState state, std::int64_t count) {
    return allocator.allocate_elements(state, static_cast<std::size_t>(count * hidden), type);
  };
  constexpr MemoryState kept = MemoryState::activations, passing = MemoryState::workspace;
  // The router's logits (rounded to the param type), then their softmax in fp32.
  saved.probabilities = allocator.allocate_floats(kept, static_cast<std::size_t>(rows * experts));
  float* probabilities = saved.probabilities.floats();
  {
    Buffer logits = allocator.allocate_elements(passing, static_cast<std::size_t>(rows * experts), type);
    kernels.gemm({.transpose_b = Transpose::yes, .m = rows, .n = experts, .k = hidden, .a = input, .lda = hidden,
                  .b = parameters.router, .ldb = hidden, .c = logits.as<void>(), .ldc = experts, .input = type, .output = type});
    kernels.convert(logits.as<void>(), type, probabilities, DataType::float32, static_cast<std::size_t>(rows * experts));
  }
  kernels.softmax_rows(probabilities, rows, experts);
  std::vector<float> host_probabilities(static_cast<std::size_t>(rows * experts));
  allocator.copy_to_host(host_probabilities.data(), probabilities, saved.probabilities.bytes());
  saved.routing = route(pass, host_probabilities.data(), rows, statistics);
  const MoeRouting& routing = saved.routing;
  MoeRoutingTables& tables = saved.tables;
  tables = {.token = upload(allocator, routing.token),
            .weight = upload(allocator, routing.weight),
            .grouping = upload(allocator, routing.grouping),
            .ungrouping = upload(allocator, routing.ungrouping)};
  const auto* token = tables.token.as<std::int32_t>();

  // Dispatch: this rank's kept assignments, packed, to the ranks of their experts.
  const bool alone = pass.exchange.expert_ranks() == 1;
  Buffer packed = rows_of(alone ? kept : passing, routing.kept());
  kernels.gather_rows(input, token, nullptr, packed.as<void>(), routing.kept(), hidden, type);
  saved.expert_input = reorder(
      pass, exchange(pass, std::move(packed), routing.send_rows, routing.receive_rows, hidden, type, passing),
      tables.grouping, hidden, type, kept);

  // The experts, each over its rows.
  const std::int64_t received = routing.received();
  saved.expert_pre = rows_of(kept, received);
  Buffer expert_output = rows_of(alone ? kept : passing, received);
  std::int64_t offset = 0;
  for (int local = 0; local < local_experts_; ++local) {
    const std::int64_t count = routing.rows_per_local_expert[local];
    if (count == 0) continue;
    void* pre = advance(saved.expert_pre.as<void>(), static_cast<std::size_t>(offset * hidden), type);
    // pre = x W_e^T + b_e, rounded once; then its GELU.
    kernels.gemm({.transpose_b = Transpose::yes, .m = count, .n = hidden, .k = hidden,
                  .a = advance(saved.expert_input.as<void>(), static_cast<std::size_t>(offset * hidden), type),
                  .lda = hidden, .b = advance(parameters.weight, static_cast<std::size_t>(local * hidden * hidden), type),
                  .ldb = hidden, .c = pre, .ldc = hidden, .input = type, .output = type,
                  .bias = advance(parameters.bias, static_cast<std::size_t>(local * hidden), type),
                  .varying = Varying::m});
    kernels.gelu_forward(pre, advance(expert_output.as<void>(), static_cast<std::size_t>(offset * hidden), type), count,
                         hidden, type);
    offset += count;
  }

  // Combine: the outputs come back in packed order and are summed into their tokens' rows, in
  // fp32, rounded once.
  saved.returned = exchange(pass, reorder(pass, std::move(expert_output), tables.ungrouping, hidden, type, passing),
                            routing.receive_rows, routing.send_rows, hidden, type, kept);
  combine(pass, saved.returned, type, routing, tables.weight.floats(), output, type, rows, hidden);
}

void MoeLayer::backward(const Pass& pass, const void* input, const void* grad_output, std::int64_t rows,
                        void* grad_input, MoeActivations& saved, bool accumulate, int micro_batches,
                        float loss_scale) const {
  Kernels& kernels = pass.kernels;
  Allocator& allocator = pass.allocator;
  const MoeParameters& parameters = pass.parameters != nullptr ? *pass.parameters : store_;
  const std::int64_t hidden = spec_.out_features, experts = spec_.experts;
  const DataType type = precision_.param, grad_type = precision_.reduce;
  constexpr MemoryState passing = MemoryState::workspace;
  const auto rows_of = [&](std::int64_t count) {
    return allocator.allocate_elements(passing, static_cast<std::size_t>(count * hidden), type);
  };
  const auto at = [&](void* data, std::int64_t element) { return advance(data, static_cast<std::size_t>(element), type); };
  const MoeRouting& routing = saved.routing;
  const MoeRoutingTables& tables = saved.tables;
  const auto* token = tables.token.as<std::int32_t>();
  const std::int64_t kept = routing.kept();

  // Through the combine: d loss / d p of each kept assignment is <dy, expert output>, and the
  // expert output's gradient is p dy.
  Buffer probability_grads = allocator.allocate_floats(passing, static_cast<std::size_t>(kept));
  kernels.row_dots(grad_output, token, saved.returned.as<void>(), probability_grads.floats(), kept, hidden, type);
  saved.returned.reset();
  Buffer packed = rows_of(kept);
  kernels.gather_rows(grad_output, token, tables.weight.floats(), packed.as<void>(), kept, hidden, type);
  Buffer output_grads = reorder(
      pass, exchange(pass, std::move(packed), routing.send_rows, routing.receive_rows, hidden, type, passing),
      tables.grouping, hidden, type, passing);

  // The experts' backward.
  const std::int64_t received = routing.received();
  Buffer pre_grads = rows_of(received);
  Buffer input_grads = rows_of(received);
  std::int64_t offset = 0;
  for (int local = 0; local < local_experts_; ++local) {
    const std::int64_t count = routing.rows_per_local_expert[local];
    void* pre_grad = at(pre_grads.as<void>(), offset * hidden);
    // An expert that got no rows still writes its (zero) gradients when not accumulating.
    kernels.gelu_backward(at(output_grads.as<void>(), offset * hidden), at(saved.expert_pre.as<void>(), offset * hidden),
                          pre_grad, type, advance(parameters.bias_grad, static_cast<std::size_t>(local * hidden), grad_type),
                          grad_type, accumulate, count, hidden);
    kernels.gemm({.m = count, .n = hidden, .k = hidden, .a = pre_grad, .lda = hidden,
                  .b = at(parameters.weight, local * hidden * hidden), .ldb = hidden,
                  .c = at(input_grads.as<void>(), offset * hidden), .ldc = hidden, .input = type, .output = type,
                  .varying = Varying::m});
    kernels.gemm({.transpose_a = Transpose::yes, .m = hidden, .n = hidden, .k = count, .a = pre_grad, .lda = hidden,
                  .b = at(saved.expert_input.as<void>(), offset * hidden), .ldb = hidden,
                  .beta = accumulate ? 1.0f : 0.0f,
                  .c = advance(parameters.weight_grad, static_cast<std::size_t>(local * hidden * hidden), grad_type),
                  .ldc = hidden, .input = type, .output = grad_type, .varying = Varying::k});
    offset += count;
  }
  output_grads.reset();
  pre_grads.reset();
  saved.expert_pre.reset();
  saved.expert_input.reset();
  // The input gradient: the experts' rows (rounded: they travel back to their tokens' ranks)
  // and below the router's part, summed in fp32 and rounded once.
  Buffer token_grads = exchange(pass, reorder(pass, std::move(input_grads), tables.ungrouping, hidden, type, passing),
                                routing.receive_rows, routing.send_rows, hidden, type, passing);
  const auto grad_count = static_cast<std::size_t>(rows * hidden);
  Buffer grad_sums;
  float* grad_input_sums = fp32_sums(pass, type, grad_input, grad_count, grad_sums);
  combine(pass, token_grads, type, routing, nullptr, grad_input_sums, DataType::float32, rows, hidden);
  token_grads.reset();

  // Through the router: d loss / d p_te is the dot product of the kept assignment (scattered on
  // the host, where the routing is; a tensor rank holds only its own experts' assignments, so
  // the tensor group sums them), plus for the auxiliary loss a E sum_e f_e mean_t(p_te), averaged
  // over the step's micro-batches, a E f_e / (T M) on every token (scaled as the loss is).
  std::vector<float> dots(static_cast<std::size_t>(kept));
  allocator.copy_to_host(dots.data(), probability_grads.floats(), probability_grads.bytes());
  std::vector<float> grad_p(static_cast<std::size_t>(rows * experts), 0.0f);
  for (std::int64_t index = 0; index < kept; ++index)
    grad_p[routing.token[index] * experts + routing.expert[index]] = dots[index];
  Buffer router_grads = allocator.allocate_floats(passing, static_cast<std::size_t>(rows * experts));
  allocator.copy_to_device(router_grads.floats(), grad_p.data(), router_grads.bytes());
  float* grad_logits = router_grads.floats();
  if (pass.exchange.tensor_ranks() > 1) pass.exchange.sum_over_tensor_group(grad_logits, grad_p.size());
  const double aux_scale = routing.tokens > 0 ? settings_.aux_loss_coef * static_cast<double>(experts) /
                                                    (routing.tokens * micro_batches) * loss_scale
                                              : 0.0;
  std::vector<float> aux(static_cast<std::size_t>(experts));
  for (std::int64_t expert = 0; expert < experts; ++expert)
    aux[expert] = static_cast<float>(aux_scale * routing.fraction[expert]);
  Buffer aux_grads = allocator.allocate_floats(passing, aux.size());
  allocator.copy_to_device(aux_grads.floats(), aux.data(), aux_grads.bytes());
  kernels.bias_add(grad_logits, aux_grads.floats(), rows, experts);
  kernels.softmax_backward_rows(saved.probabilities.floats(), grad_logits, grad_logits, rows, experts);
  // The logits' gradient rounded to the param type, as every d(pre) is, for the router's GEMMs.
  Buffer rounded;
  const void* logits_grad = grad_logits;
  if (type != DataType::float32) {
    rounded = allocator.allocate_elements(passing, static_cast<std::size_t>(rows * experts), type);
    kernels.convert(grad_logits, DataType::float32, rounded.as<void>(), type, static_cast<std::size_t>(rows * experts));
    logits_grad = rounded.as<void>();
  }
  // The router's part of the input gradient, once over the tensor group (which sums it).
  if (pass.exchange.tensor_rank() == 0)
    kernels.gemm({.m = rows, .n = hidden, .k = experts, .a = logits_grad, .lda = experts, .b = parameters.router,
                  .ldb = hidden, .beta = 1.0f, .c = grad_input_sums, .ldc = hidden, .input = type,
                  .output = DataType::float32});
  round_sums(pass, grad_sums, grad_input, type, grad_count);
  kernels.gemm({.transpose_a = Transpose::yes, .m = experts, .n = hidden, .k = rows, .a = logits_grad, .lda = experts,
                .b = input, .ldb = hidden, .beta = accumulate ? 1.0f : 0.0f, .c = parameters.router_grad, .ldc = hidden,
                .input = type, .output = grad_type});
}

std::int64_t moe_activation_bytes(const LayerSpec& spec, int local_experts, int expert_ranks, std::int64_t rows,
                                  DataType row_type) {
  const std::int64_t hidden = spec.out_features;
  const std::int64_t assignments = rows * spec.top_k * local_experts * expert_ranks / spec.experts;
  const auto row_bytes = static_cast<std::int64_t>(size_of(row_type));
  // Probabilities (fp32), three rows of activations per assignment, its token and weight, and with
  // experts on other ranks the two reorderings of the received rows (int32 each).
  const std::int64_t reorderings = expert_ranks > 1 ? 2 : 0;
  return 4 * rows * spec.experts + assignments * (3 * hidden * row_bytes + 4 * (2 + reorderings));
}

}  // namespace mlptrain
