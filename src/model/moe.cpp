// The MoE layer's routing, dispatch, experts and combine (see moe.hpp).
#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace mlptrain {

void SingleProcessExchange::gather_statistics(const double* local, double* all, std::size_t count) {
  std::copy_n(local, count, all);
}

void SingleProcessExchange::exchange_rows(const float* send, const std::vector<std::size_t>& send_floats,
                                          float* receive, const std::vector<std::size_t>&) {
  std::copy_n(send, send_floats.at(0), receive);
}

std::int64_t MoeRouting::received() const {
  return std::accumulate(rows_per_local_expert.begin(), rows_per_local_expert.end(), std::int64_t{0});
}

MoeLayer::MoeLayer(const ParameterStore& store, const LayerSpec& spec, const std::string& base_path,
                   const MoeSettings& settings)
    : spec_(spec), settings_(settings) {
  const ParameterTensor& router = store.tensor(base_path + "/router/weight");
  const ParameterTensor& weight = store.tensor(base_path + "/experts/weight");
  const ParameterTensor& bias = store.tensor(base_path + "/experts/bias");
  first_expert_ = static_cast<int>(weight.local_start[0]);
  local_experts_ = static_cast<int>(weight.local_shape[0]);
  if (store.values() != nullptr) {
    router_ = store.values() + router.offset;
    weight_ = store.values() + weight.offset;
    bias_ = store.values() + bias.offset;
  }
  if (store.grads() != nullptr) {
    router_grad_ = store.grads() + router.offset;
    weight_grad_ = store.grads() + weight.offset;
    bias_grad_ = store.grads() + bias.offset;
  }
}

namespace {

// Per data rank and expert: assignments, and router probability sums, then the rank's tokens.
struct Gathered {
  std::vector<double> values;
  std::size_t experts = 0;
  double count(int rank, std::size_t expert) const { return values[rank * (2 * experts + 1) + expert]; }
  double probability_sum(int rank, std::size_t expert) const {
    return values[rank * (2 * experts + 1) + experts + expert];
  }
  double tokens(int rank) const { return values[rank * (2 * experts + 1) + 2 * experts]; }
};

}  // namespace

MoeRouting MoeLayer::route(const Pass& pass, const float* probabilities, std::int64_t rows,
                           MoeStatistics* statistics) const {
  const auto experts = static_cast<std::size_t>(spec_.experts);
  const int top_k = spec_.top_k;
  // This rank's top-k choices, the tokens of each expert in token order.
  std::vector<std::vector<std::int32_t>> tokens_of(experts);
  std::vector<double> local(2 * experts + 1, 0.0);
  std::vector<char> taken(experts);
  for (std::int64_t token = 0; token < rows; ++token) {
    const float* p = probabilities + token * spec_.experts;
    std::fill(taken.begin(), taken.end(), 0);
    for (int choice = 0; choice < top_k; ++choice) {
      std::size_t best = experts;
      for (std::size_t expert = 0; expert < experts; ++expert)
        if (!taken[expert] && (best == experts || p[expert] > p[best])) best = expert;
      taken[best] = 1;
      tokens_of[best].push_back(static_cast<std::int32_t>(token));
      local[best] += 1;
    }
    for (std::size_t expert = 0; expert < experts; ++expert) local[experts + expert] += p[expert];
  }
  local[2 * experts] = static_cast<double>(rows);

  ExpertExchange& exchange = pass.exchange;
  const int data_ranks = exchange.data_ranks();
  Gathered all{std::vector<double>(local.size() * static_cast<std::size_t>(data_ranks)), experts};
  exchange.gather_statistics(local.data(), all.values.data(), local.size());

  MoeRouting routing;
  for (int rank = 0; rank < data_ranks; ++rank) routing.tokens += all.tokens(rank);
  const double capacity = settings_.capacity_factor > 0
                              ? std::ceil(settings_.capacity_factor * top_k * routing.tokens /
                                          static_cast<double>(experts))
                              : std::numeric_limits<double>::infinity();
  // kept[rank][expert]: the first `capacity` assignments of each expert in global sample order,
  // that is by data rank, then token.
  std::vector<std::vector<double>> kept(static_cast<std::size_t>(data_ranks), std::vector<double>(experts));
  std::vector<double> total(experts, 0.0), probability_total(experts, 0.0);
  for (int rank = 0; rank < data_ranks; ++rank) {
    for (std::size_t expert = 0; expert < experts; ++expert) {
      const double before = total[expert];
      kept[rank][expert] = std::clamp(capacity - before, 0.0, all.count(rank, expert));
      total[expert] += all.count(rank, expert);
      probability_total[expert] += all.probability_sum(rank, expert);
    }
  }
  routing.fraction.resize(experts);
  double aux_loss = 0, dropped = 0;
  for (std::size_t expert = 0; expert < experts; ++expert) {
    routing.fraction[expert] = routing.tokens > 0 ? total[expert] / (top_k * routing.tokens) : 0.0;
    const double mean_probability = routing.tokens > 0 ? probability_total[expert] / routing.tokens : 0.0;
    aux_loss += routing.fraction[expert] * mean_probability;
    dropped += std::max(0.0, total[expert] - capacity);
  }
  aux_loss *= settings_.aux_loss_coef * static_cast<double>(experts);

  const int me = exchange.data_rank();
  for (std::size_t expert = 0; expert < experts; ++expert) {
    const auto keep = static_cast<std::size_t>(kept[me][expert]);
    for (std::size_t index = 0; index < keep; ++index) {
      const std::int32_t token = tokens_of[expert][index];
      routing.token.push_back(token);
      routing.expert.push_back(static_cast<std::int32_t>(expert));
      routing.weight.push_back(probabilities[token * spec_.experts + static_cast<std::int64_t>(expert)]);
    }
  }

  // Who sends what to whom in the EP group.
  const int expert_ranks = exchange.expert_ranks();
  const std::size_t per_rank = experts / static_cast<std::size_t>(expert_ranks);
  const int first_peer = me - exchange.expert_rank();  // data rank of expert rank 0
  routing.send_rows.assign(static_cast<std::size_t>(expert_ranks), 0);
  routing.receive_rows.assign(static_cast<std::size_t>(expert_ranks), 0);
  routing.rows_per_local_expert.assign(static_cast<std::size_t>(local_experts_), 0);
  for (int peer = 0; peer < expert_ranks; ++peer) {
    for (std::size_t index = 0; index < per_rank; ++index) {
      const std::size_t theirs = static_cast<std::size_t>(peer) * per_rank + index;
      const std::size_t mine = static_cast<std::size_t>(first_expert_) + index;
      routing.send_rows[peer] += static_cast<std::size_t>(kept[me][theirs]);
      const auto arriving = static_cast<std::size_t>(kept[first_peer + peer][mine]);
      routing.receive_rows[peer] += arriving;
      routing.rows_per_local_expert[index] += static_cast<std::int64_t>(arriving);
    }
  }
  if (expert_ranks > 1) {
    // Received rows are [source][local expert][token]; the experts want [local expert][source].
    std::vector<std::int32_t> source_start(static_cast<std::size_t>(expert_ranks), 0);
    for (int peer = 1; peer < expert_ranks; ++peer)
      source_start[peer] = source_start[peer - 1] + static_cast<std::int32_t>(routing.receive_rows[peer - 1]);
    for (std::size_t index = 0; index < per_rank; ++index) {
      for (int peer = 0; peer < expert_ranks; ++peer) {
        std::int32_t within = 0;  // rows of the source's earlier local experts
        for (std::size_t earlier = 0; earlier < index; ++earlier)
          within += static_cast<std::int32_t>(kept[first_peer + peer][first_expert_ + earlier]);
        const auto count = static_cast<std::int32_t>(kept[first_peer + peer][first_expert_ + index]);
        for (std::int32_t row = 0; row < count; ++row)
          routing.grouping.push_back(source_start[peer] + within + row);
      }
    }
    routing.ungrouping.resize(routing.grouping.size());
    for (std::size_t position = 0; position < routing.grouping.size(); ++position)
      routing.ungrouping[routing.grouping[position]] = static_cast<std::int32_t>(position);
  }

  if (statistics != nullptr) {
    std::vector<double>& load = statistics->expert_load[spec_.index];
    load.resize(experts, 0.0);
    for (std::size_t expert = 0; expert < experts; ++expert) load[expert] += total[expert];
    statistics->aux_loss += aux_loss;
    statistics->dropped += dropped;
    // Four exchanges: rows out and back in forward, their gradients out and back in backward.
    if (expert_ranks > 1)
      statistics->all_to_all_bytes += 2.0 * static_cast<double>(routing.kept() + routing.received()) *
                                      static_cast<double>(spec_.out_features * sizeof(float));
  }
  return routing;
}

namespace {

Buffer floats(Allocator& allocator, MemoryState state, std::int64_t count) {
  return allocator.allocate_floats(state, static_cast<std::size_t>(count));
}

std::vector<std::size_t> times(const std::vector<std::size_t>& rows, std::int64_t width) {
  std::vector<std::size_t> result;
  for (std::size_t count : rows) result.push_back(count * static_cast<std::size_t>(width));
  return result;
}

template <typename T>
Buffer upload(Allocator& allocator, const std::vector<T>& values) {
  Buffer buffer = allocator.allocate(MemoryState::activations, values.size() * sizeof(T));
  allocator.copy_to_device(buffer.as<void>(), values.data(), buffer.bytes());
  return buffer;
}

// Rows in packed order (grouped by source rank on the expert side) sent to the other side of the
// exchange; `rows_out` and `rows_in` per rank. With one expert rank, the rows stay.
Buffer exchange(const MoeLayer::Pass& pass, Buffer rows, const std::vector<std::size_t>& rows_out,
                const std::vector<std::size_t>& rows_in, std::int64_t width, MemoryState state) {
  if (pass.exchange.expert_ranks() == 1) return rows;
  const auto total = static_cast<std::int64_t>(std::accumulate(rows_in.begin(), rows_in.end(), std::size_t{0}));
  Buffer received = floats(pass.allocator, state, total * width);
  pass.exchange.exchange_rows(rows.floats(), times(rows_out, width), received.floats(),
                              times(rows_in, width));
  return received;
}

// Reorders rows by `order` (int32, destination row i = source row order[i]); none needed when
// empty.
Buffer reorder(const MoeLayer::Pass& pass, Buffer rows, const Buffer& order, std::int64_t width,
               MemoryState state) {
  if (order.empty()) return rows;
  const auto count = static_cast<std::int64_t>(order.bytes() / sizeof(std::int32_t));
  Buffer result = floats(pass.allocator, state, count * width);
  pass.kernels.gather_rows(rows.floats(), order.as<std::int32_t>(), nullptr, result.floats(), count, width);
  return result;
}

}  // namespace

void MoeLayer::forward(const Pass& pass, const float* input, std::int64_t rows, float* output,
                       MoeActivations& saved, MoeStatistics* statistics) const {
  Kernels& kernels = pass.kernels;
  const std::int64_t hidden = spec_.out_features, experts = spec_.experts;
  constexpr MemoryState kept = MemoryState::activations, passing = MemoryState::workspace;
  saved.probabilities = floats(pass.allocator, kept, rows * experts);
  float* probabilities = saved.probabilities.floats();
  kernels.gemm(Transpose::no, Transpose::yes, rows, experts, hidden, 1.0f, input, hidden, router_,
               hidden, 0.0f, probabilities, experts);
  kernels.softmax_rows(probabilities, rows, experts);
  std::vector<float> host_probabilities(static_cast<std::size_t>(rows * experts));
  pass.allocator.copy_to_host(host_probabilities.data(), probabilities, saved.probabilities.bytes());
  saved.routing = route(pass, host_probabilities.data(), rows, statistics);
  const MoeRouting& routing = saved.routing;
  MoeRoutingTables& tables = saved.tables;
  tables = {.token = upload(pass.allocator, routing.token),
            .weight = upload(pass.allocator, routing.weight),
            .grouping = upload(pass.allocator, routing.grouping),
            .ungrouping = upload(pass.allocator, routing.ungrouping)};
  const auto* token = tables.token.as<std::int32_t>();

  // Dispatch: this rank's kept assignments, packed, to the ranks of their experts.
  const bool alone = pass.exchange.expert_ranks() == 1;
  Buffer packed = floats(pass.allocator, alone ? kept : passing, routing.kept() * hidden);
  kernels.gather_rows(input, token, nullptr, packed.floats(), routing.kept(), hidden);
  saved.expert_input = reorder(
      pass, exchange(pass, std::move(packed), routing.send_rows, routing.receive_rows, hidden, passing),
      tables.grouping, hidden, kept);

  // The experts, each over its rows.
  const std::int64_t received = routing.received();
  saved.expert_pre = floats(pass.allocator, kept, received * hidden);
  Buffer expert_output = floats(pass.allocator, alone ? kept : passing, received * hidden);
  std::int64_t offset = 0;
  for (int local = 0; local < local_experts_; ++local) {
    const std::int64_t count = routing.rows_per_local_expert[local];
    if (count == 0) continue;
    float* pre = saved.expert_pre.floats() + offset * hidden;
    kernels.gemm(Transpose::no, Transpose::yes, count, hidden, hidden, 1.0f,
                 saved.expert_input.floats() + offset * hidden, hidden,
                 weight_ + local * hidden * hidden, hidden, 0.0f, pre, hidden);
    kernels.bias_gelu_forward(pre, bias_ + local * hidden, expert_output.floats() + offset * hidden,
                              count, hidden);
    offset += count;
  }

  // Combine: the outputs come back in packed order and are summed into their tokens' rows.
  saved.returned = exchange(pass, reorder(pass, std::move(expert_output), tables.ungrouping, hidden, passing),
                            routing.receive_rows, routing.send_rows, hidden, kept);
  kernels.fill(output, static_cast<std::size_t>(rows * hidden), 0.0f);
  kernels.scatter_add_rows(saved.returned.floats(), token, tables.weight.floats(), output,
                           routing.kept(), hidden);
}

void MoeLayer::backward(const Pass& pass, const float* input, const float* grad_output,
                        std::int64_t rows, float* grad_input, MoeActivations& saved,
                        bool accumulate, int micro_batches) const {
  Kernels& kernels = pass.kernels;
  const std::int64_t hidden = spec_.out_features, experts = spec_.experts;
  constexpr MemoryState passing = MemoryState::workspace;
  const MoeRouting& routing = saved.routing;
  const MoeRoutingTables& tables = saved.tables;
  const auto* token = tables.token.as<std::int32_t>();
  const std::int64_t kept = routing.kept();

  // Through the combine: d loss / d p of each kept assignment is <dy, expert output>, and the
  // expert output's gradient is p dy.
  Buffer probability_grads = floats(pass.allocator, passing, kept);
  kernels.row_dots(grad_output, token, saved.returned.floats(), probability_grads.floats(), kept, hidden);
  saved.returned.reset();
  Buffer packed = floats(pass.allocator, passing, kept * hidden);
  kernels.gather_rows(grad_output, token, tables.weight.floats(), packed.floats(), kept, hidden);
  Buffer output_grads = reorder(
      pass, exchange(pass, std::move(packed), routing.send_rows, routing.receive_rows, hidden, passing),
      tables.grouping, hidden, passing);

  // The experts' backward.
  const std::int64_t received = routing.received();
  Buffer pre_grads = floats(pass.allocator, passing, received * hidden);
  Buffer input_grads = floats(pass.allocator, passing, received * hidden);
  std::int64_t offset = 0;
  for (int local = 0; local < local_experts_; ++local) {
    const std::int64_t count = routing.rows_per_local_expert[local];
    const std::int64_t at = offset * hidden;
    float* pre_grad = pre_grads.floats() + at;
    // An expert that got no rows still writes its (zero) gradients when not accumulating.
    kernels.gelu_backward(output_grads.floats() + at, saved.expert_pre.floats() + at, pre_grad,
                          bias_grad_ + local * hidden, accumulate, count, hidden);
    kernels.gemm(Transpose::no, Transpose::no, count, hidden, hidden, 1.0f, pre_grad, hidden,
                 weight_ + local * hidden * hidden, hidden, 0.0f, input_grads.floats() + at, hidden);
    kernels.gemm(Transpose::yes, Transpose::no, hidden, hidden, count, 1.0f, pre_grad, hidden,
                 saved.expert_input.floats() + at, hidden, accumulate ? 1.0f : 0.0f,
                 weight_grad_ + local * hidden * hidden, hidden);
    offset += count;
  }
  output_grads.reset();
  pre_grads.reset();
  saved.expert_pre.reset();
  saved.expert_input.reset();
  Buffer token_grads = exchange(pass, reorder(pass, std::move(input_grads), tables.ungrouping, hidden, passing),
                                routing.receive_rows, routing.send_rows, hidden, passing);
  kernels.fill(grad_input, static_cast<std::size_t>(rows * hidden), 0.0f);
  kernels.scatter_add_rows(token_grads.floats(), token, nullptr, grad_input, kept, hidden);

  // Through the router: the auxiliary loss a E sum_e f_e mean_t(p_te), averaged over the step's
  // micro-batches, adds a E f_e / (T M) to every d loss / d p_te. Built on the host, where the
  // routing is.
  std::vector<float> dots(static_cast<std::size_t>(kept));
  pass.allocator.copy_to_host(dots.data(), probability_grads.floats(), probability_grads.bytes());
  std::vector<float> grad_p(static_cast<std::size_t>(rows * experts));
  const double aux_scale = routing.tokens > 0
                               ? settings_.aux_loss_coef * static_cast<double>(experts) /
                                     (routing.tokens * micro_batches)
                               : 0.0;
  for (std::int64_t token = 0; token < rows; ++token)
    for (std::int64_t expert = 0; expert < experts; ++expert)
      grad_p[token * experts + expert] = static_cast<float>(aux_scale * routing.fraction[expert]);
  for (std::int64_t index = 0; index < kept; ++index)
    grad_p[routing.token[index] * experts + routing.expert[index]] += dots[index];
  Buffer router_grads = floats(pass.allocator, passing, rows * experts);
  pass.allocator.copy_to_device(router_grads.floats(), grad_p.data(), router_grads.bytes());
  float* grad_logits = router_grads.floats();
  kernels.softmax_backward_rows(saved.probabilities.floats(), grad_logits, grad_logits, rows, experts);
  kernels.gemm(Transpose::no, Transpose::no, rows, hidden, experts, 1.0f, grad_logits, experts,
               router_, hidden, 1.0f, grad_input, hidden);
  kernels.gemm(Transpose::yes, Transpose::no, experts, hidden, rows, 1.0f, grad_logits, experts,
               input, hidden, accumulate ? 1.0f : 0.0f, router_grad_, hidden);
}

std::int64_t moe_activation_bytes(const LayerSpec& spec, int local_experts, std::int64_t rows) {
  const std::int64_t hidden = spec.out_features, assignments = rows * spec.top_k;
  // Probabilities, three rows of activations per assignment, its token and weight, and with
  // experts on other ranks the two reorderings of the received rows.
  const std::int64_t reorderings = local_experts < spec.experts ? 2 : 0;
  return 4 * rows * spec.experts + 4 * assignments * (3 * hidden + 2 + reorderings);
}

}  // namespace mlptrain
