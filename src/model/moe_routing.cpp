// An MoE layer's routing (see moe_routing.hpp).
#include "model/moe_routing.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mlptrain {

std::int64_t MoeRouting::received() const {
  return std::accumulate(rows_per_local_expert.begin(), rows_per_local_expert.end(), std::int64_t{0});
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

MoeRouting route_tokens(const LayerSpec& spec, const MoeSettings& settings, ExpertSlice held, ExpertExchange& exchange,
                        std::size_t row_bytes, const float* probabilities, std::int64_t rows, MoeStatistics* statistics) {
  const auto experts = static_cast<std::size_t>(spec.experts);
  const int top_k = spec.top_k;
  // This rank's top-k choices, the tokens of each expert in token order.
  std::vector<std::vector<std::int32_t>> tokens_of(experts);
  std::vector<double> local(2 * experts + 1, 0.0);
  std::vector<char> taken(experts);
  for (std::int64_t token = 0; token < rows; ++token) {
    const float* p = probabilities + token * spec.experts;
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

  const int data_ranks = exchange.data_ranks();
  Gathered all{std::vector<double>(local.size() * static_cast<std::size_t>(data_ranks)), experts};
  exchange.gather_statistics(local.data(), all.values.data(), local.size());

  MoeRouting routing;
  for (int rank = 0; rank < data_ranks; ++rank) routing.tokens += all.tokens(rank);
  const double capacity = settings.capacity_factor > 0
                              ? std::ceil(settings.capacity_factor * top_k * routing.tokens /
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
  aux_loss *= settings.aux_loss_coef * static_cast<double>(experts);

  const int me = exchange.data_rank();
  // Expert rank j holds experts [j E/X, (j+1) E/X); within that block this rank's tensor slice
  // holds [within, within + local experts). Every tensor rank routes alike and keeps the
  // assignments of its own slice.
  const int expert_ranks = exchange.expert_ranks();
  const std::size_t per_rank = experts / static_cast<std::size_t>(expert_ranks);
  const std::size_t within =
      static_cast<std::size_t>(held.first) - static_cast<std::size_t>(exchange.expert_rank()) * per_rank;
  const auto slice = static_cast<std::size_t>(held.count);
  for (std::size_t expert = 0; expert < experts; ++expert) {
    if (expert % per_rank < within || expert % per_rank >= within + slice) continue;
    const auto keep = static_cast<std::size_t>(kept[me][expert]);
    for (std::size_t index = 0; index < keep; ++index) {
      const std::int32_t token = tokens_of[expert][index];
      routing.token.push_back(token);
      routing.expert.push_back(static_cast<std::int32_t>(expert));
      routing.weight.push_back(probabilities[token * spec.experts + static_cast<std::int64_t>(expert)]);
    }
  }
  routing.token_row_begin.assign(static_cast<std::size_t>(rows + 1), 0);
  for (std::int32_t owner : routing.token) ++routing.token_row_begin[static_cast<std::size_t>(owner) + 1];
  std::partial_sum(routing.token_row_begin.begin(), routing.token_row_begin.end(), routing.token_row_begin.begin());
  routing.token_rows.resize(routing.token.size());
  std::vector<std::int32_t> next(routing.token_row_begin.begin(), routing.token_row_begin.end() - 1);
  for (std::size_t row = 0; row < routing.token.size(); ++row)
    routing.token_rows[static_cast<std::size_t>(next[static_cast<std::size_t>(routing.token[row])]++)] =
        static_cast<std::int32_t>(row);

  // Who sends what to whom in the EP group (of this tensor slice).
  const int first_peer = me - exchange.expert_rank();  // data rank of expert rank 0
  routing.send_rows.assign(static_cast<std::size_t>(expert_ranks), 0);
  routing.receive_rows.assign(static_cast<std::size_t>(expert_ranks), 0);
  routing.rows_per_local_expert.assign(slice, 0);
  for (int peer = 0; peer < expert_ranks; ++peer) {
    for (std::size_t index = 0; index < slice; ++index) {
      const std::size_t theirs = static_cast<std::size_t>(peer) * per_rank + within + index;
      const std::size_t mine = static_cast<std::size_t>(held.first) + index;
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
    for (std::size_t index = 0; index < slice; ++index) {
      for (int peer = 0; peer < expert_ranks; ++peer) {
        std::int32_t earlier_rows = 0;  // rows of the source's earlier local experts
        for (std::size_t earlier = 0; earlier < index; ++earlier)
          earlier_rows += static_cast<std::int32_t>(kept[first_peer + peer][held.first + earlier]);
        const auto count = static_cast<std::int32_t>(kept[first_peer + peer][held.first + index]);
        for (std::int32_t row = 0; row < count; ++row)
          routing.grouping.push_back(source_start[peer] + earlier_rows + row);
      }
    }
    routing.ungrouping.resize(routing.grouping.size());
    for (std::size_t position = 0; position < routing.grouping.size(); ++position)
      routing.ungrouping[routing.grouping[position]] = static_cast<std::int32_t>(position);
  }

  if (statistics != nullptr) {
    std::vector<double>& load = statistics->expert_load[spec.index];
    load.resize(experts, 0.0);
    for (std::size_t expert = 0; expert < experts; ++expert) load[expert] += total[expert];
    statistics->aux_loss += aux_loss;
    statistics->dropped += dropped;
    // Four exchanges: rows out and back in forward, their gradients out and back in backward.
    if (expert_ranks > 1)
      statistics->all_to_all_bytes += 2.0 * static_cast<double>(routing.kept() + routing.received()) *
                                      static_cast<double>(spec.out_features) * static_cast<double>(row_bytes);
  }
  return routing;
}

}  // namespace mlptrain
