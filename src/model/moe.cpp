// The MoE layer's passes (see moe.hpp): forward as routing, dispatch, experts and combine;
// backward as those in reverse: through the combine, the experts' backward, the input gradient
// back to the tokens, through the router. Row moves are in moe_rows.hpp, the routing in
// moe_routing.hpp.
#include "model/moe.hpp"

#include "model/moe_rows.hpp"

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

void MoeLayer::forward(const Pass& pass, const void* input, std::int64_t rows, void* output,
                       MoeActivations& saved, MoeStatistics* statistics) const {
  Kernels& kernels = pass.kernels;
  Allocator& allocator = pass.allocator;
  const MoeParameters& parameters = pass.parameters != nullptr ? *pass.parameters : store_;
  const MoeRowMoves moves{kernels, allocator, pass.exchange};
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
  saved.routing = route_tokens(spec_, settings_, {.first = first_expert_, .count = local_experts_}, pass.exchange,
                               precision_.param_bytes(), host_probabilities.data(), rows, statistics);
  const MoeRouting& routing = saved.routing;
  MoeRoutingTables& tables = saved.tables;
  tables = {.token = moves.upload(routing.token),
            .weight = moves.upload(routing.weight),
            .grouping = moves.upload(routing.grouping),
            .ungrouping = moves.upload(routing.ungrouping)};
  const auto* token = tables.token.as<std::int32_t>();

  // Dispatch: this rank's kept assignments, packed, to the ranks of their experts.
  const bool alone = pass.exchange.expert_ranks() == 1;
  Buffer packed = rows_of(alone ? kept : passing, routing.kept());
  kernels.gather_rows(input, token, nullptr, packed.as<void>(), routing.kept(), hidden, type);
  saved.expert_input =
      moves.reordered(moves.exchanged(std::move(packed), routing.send_rows, routing.receive_rows, hidden, type, passing),
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
  saved.returned =
      moves.exchanged(moves.reordered(std::move(expert_output), tables.ungrouping, hidden, type, passing),
                      routing.receive_rows, routing.send_rows, hidden, type, kept);
  moves.combine(saved.returned, type, routing, tables.weight.floats(), output, type, rows, hidden);
}

void MoeLayer::backward(const Pass& pass, const void* input, const void* grad_output, std::int64_t rows,
                        void* grad_input, MoeActivations& saved, bool accumulate, int micro_batches,
                        float loss_scale) const {
  const MoeParameters& parameters = pass.parameters != nullptr ? *pass.parameters : store_;
  const MoeRowMoves moves{pass.kernels, pass.allocator, pass.exchange};
  const std::int64_t hidden = spec_.out_features, experts = spec_.experts;
  const DataType type = precision_.param;
  const MoeRouting& routing = saved.routing;

  CombineGradients combined = through_combine(moves, grad_output, saved);
  Buffer input_grads = experts_backward(moves, parameters, std::move(combined.output_grads), saved, accumulate);
  // The input gradient: the experts' rows (rounded: they travel back to their tokens' ranks) and
  // below the router's part, summed in fp32 and rounded once.
  Buffer token_grads = moves.exchanged(
      moves.reordered(std::move(input_grads), saved.tables.ungrouping, hidden, type, MemoryState::workspace),
      routing.receive_rows, routing.send_rows, hidden, type, MemoryState::workspace);
  const auto grad_count = static_cast<std::size_t>(rows * hidden);
  Buffer grad_sums;
  float* grad_input_sums = moves.fp32_sums(type, grad_input, grad_count, grad_sums);
  moves.combine(token_grads, type, routing, nullptr, grad_input_sums, DataType::float32, rows, hidden);
  token_grads.reset();

  Buffer logits_grad = through_router(moves, combined.probability_grads, saved, rows, micro_batches, loss_scale);
  // The router's part of the input gradient, once over the tensor group (which sums it).
  if (pass.exchange.tensor_rank() == 0)
    pass.kernels.gemm({.m = rows, .n = hidden, .k = experts, .a = logits_grad.as<void>(), .lda = experts,
                       .b = parameters.router, .ldb = hidden, .beta = 1.0f, .c = grad_input_sums, .ldc = hidden,
                       .input = type, .output = DataType::float32});
  moves.round_sums(grad_sums, grad_input, type, grad_count);
  pass.kernels.gemm({.transpose_a = Transpose::yes, .m = experts, .n = hidden, .k = rows, .a = logits_grad.as<void>(),
                     .lda = experts, .b = input, .ldb = hidden, .beta = accumulate ? 1.0f : 0.0f,
                     .c = parameters.router_grad, .ldc = hidden, .input = type, .output = precision_.reduce});
}

// d loss / d p of each kept assignment is <dy, expert output> (fp32), and the expert output's
// gradient is p dy, sent back to the experts' ranks in the experts' order.
MoeLayer::CombineGradients MoeLayer::through_combine(const MoeRowMoves& moves, const void* grad_output,
                                                     MoeActivations& saved) const {
  const std::int64_t hidden = spec_.out_features, kept = saved.routing.kept();
  const DataType type = precision_.param;
  const auto* token = saved.tables.token.as<std::int32_t>();
  CombineGradients gradients;
  gradients.probability_grads = moves.allocator.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(kept));
  moves.kernels.row_dots(grad_output, token, saved.returned.as<void>(), gradients.probability_grads.floats(), kept,
                         hidden, type);
  saved.returned.reset();
  Buffer packed = moves.allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(kept * hidden), type);
  moves.kernels.gather_rows(grad_output, token, saved.tables.weight.floats(), packed.as<void>(), kept, hidden, type);
  gradients.output_grads = moves.reordered(
      moves.exchanged(std::move(packed), saved.routing.send_rows, saved.routing.receive_rows, hidden, type,
                      MemoryState::workspace),
      saved.tables.grouping, hidden, type, MemoryState::workspace);
  return gradients;
}

// Each local expert over its rows: d(pre) through its GELU (its bias gradient from the column
// sums), the input gradient of its rows, its weight gradient. Frees what forward kept for them.
Buffer MoeLayer::experts_backward(const MoeRowMoves& moves, const MoeParameters& parameters, Buffer output_grads,
                                  MoeActivations& saved, bool accumulate) const {
  const std::int64_t hidden = spec_.out_features;
  const DataType type = precision_.param, grad_type = precision_.reduce;
  const auto at = [&](void* data, std::int64_t element) { return advance(data, static_cast<std::size_t>(element), type); };
  const std::int64_t received = saved.routing.received();
  const auto rows = static_cast<std::size_t>(received * hidden);
  Buffer pre_grads = moves.allocator.allocate_elements(MemoryState::workspace, rows, type);
  Buffer input_grads = moves.allocator.allocate_elements(MemoryState::workspace, rows, type);
  std::int64_t offset = 0;
  for (int local = 0; local < local_experts_; ++local) {
    const std::int64_t count = saved.routing.rows_per_local_expert[local];
    void* pre_grad = at(pre_grads.as<void>(), offset * hidden);
    // An expert that got no rows still writes its (zero) gradients when not accumulating.
    moves.kernels.gelu_backward(at(output_grads.as<void>(), offset * hidden), at(saved.expert_pre.as<void>(), offset * hidden),
                                pre_grad, type, advance(parameters.bias_grad, static_cast<std::size_t>(local * hidden), grad_type),
                                grad_type, accumulate, count, hidden);
    moves.kernels.gemm({.m = count, .n = hidden, .k = hidden, .a = pre_grad, .lda = hidden,
                        .b = at(parameters.weight, local * hidden * hidden), .ldb = hidden,
                        .c = at(input_grads.as<void>(), offset * hidden), .ldc = hidden, .input = type, .output = type,
                        .varying = Varying::m});
    moves.kernels.gemm({.transpose_a = Transpose::yes, .m = hidden, .n = hidden, .k = count, .a = pre_grad, .lda = hidden,
                        .b = at(saved.expert_input.as<void>(), offset * hidden), .ldb = hidden,
                        .beta = accumulate ? 1.0f : 0.0f,
                        .c = advance(parameters.weight_grad, static_cast<std::size_t>(local * hidden * hidden), grad_type),
                        .ldc = hidden, .input = type, .output = grad_type, .varying = Varying::k});
    offset += count;
  }
  saved.expert_pre.reset();
  saved.expert_input.reset();
  return input_grads;
}

// d loss / d logits, rounded to the param type as every d(pre) is, for the router's GEMMs:
// d loss / d p_te is the dot product of the kept assignment (scattered on the host, where the
// routing is; a tensor rank holds only its own experts' assignments, so the tensor group sums
// them), plus for the auxiliary loss a E sum_e f_e mean_t(p_te), averaged over the step's
// micro-batches, a E f_e / (T M) on every token (scaled as the loss is); then the softmax's
// backward, in fp32.
Buffer MoeLayer::through_router(const MoeRowMoves& moves, const Buffer& probability_grads, const MoeActivations& saved,
                                std::int64_t rows, int micro_batches, float loss_scale) const {
  Allocator& allocator = moves.allocator;
  const MoeRouting& routing = saved.routing;
  const std::int64_t experts = spec_.experts, kept = routing.kept();
  const DataType type = precision_.param;
  std::vector<float> dots(static_cast<std::size_t>(kept));
  allocator.copy_to_host(dots.data(), probability_grads.floats(), probability_grads.bytes());
  std::vector<float> grad_p(static_cast<std::size_t>(rows * experts), 0.0f);
  for (std::int64_t index = 0; index < kept; ++index)
    grad_p[routing.token[index] * experts + routing.expert[index]] = dots[index];
  Buffer router_grads = moves.upload(grad_p, MemoryState::workspace);
  float* grad_logits = router_grads.floats();
  if (moves.exchange.tensor_ranks() > 1) moves.exchange.sum_over_tensor_group(grad_logits, grad_p.size());
  const double aux_scale = routing.tokens > 0 ? settings_.aux_loss_coef * static_cast<double>(experts) /
                                                    (routing.tokens * micro_batches) * loss_scale
                                              : 0.0;
  std::vector<float> aux(static_cast<std::size_t>(experts));
  for (std::int64_t expert = 0; expert < experts; ++expert)
    aux[expert] = static_cast<float>(aux_scale * routing.fraction[expert]);
  const Buffer aux_grads = moves.upload(aux, MemoryState::workspace);
  moves.kernels.bias_add(grad_logits, aux_grads.floats(), rows, experts);
  moves.kernels.softmax_backward_rows(saved.probabilities.floats(), grad_logits, grad_logits, rows, experts);
  if (type == DataType::float32) return router_grads;
  Buffer rounded = allocator.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(rows * experts), type);
  moves.kernels.convert(grad_logits, DataType::float32, rounded.as<void>(), type, static_cast<std::size_t>(rows * experts));
  return rounded;
}

std::int64_t moe_activation_bytes(const LayerSpec& spec, int local_experts, int expert_ranks, std::int64_t rows,
                                  DataType row_type, double expert_share) {
  const std::int64_t hidden = spec.out_features;
  const std::int64_t balanced = rows * spec.top_k * local_experts * expert_ranks / spec.experts;
  // A rank that holds every expert gets every assignment, however the router spreads them.
  const std::int64_t assignments =
      local_experts < spec.experts ? std::llround(static_cast<double>(balanced) * expert_share) : balanced;
  const auto row_bytes = static_cast<std::int64_t>(size_of(row_type));
  // Probabilities (fp32), three rows of activations per assignment, its token and weight, and with
  // experts on other ranks the two reorderings of the received rows (int32 each).
  const std::int64_t reorderings = expert_ranks > 1 ? 2 : 0;
  return 4 * rows * spec.experts + assignments * (3 * hidden * row_bytes + 4 * (2 + reorderings));
}

}  // namespace mlptrain
