// MoE layer in one process: backward (through experts, combine weights, router and the
// auxiliary loss) against finite differences of forward, and gradient accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.hpp"
#include "model/moe.hpp"
#include "model/parameter_store.hpp"
#include "model/state_ranges.hpp"

using namespace mlptrain;

namespace {

constexpr std::int64_t rows = 6, hidden = 5;

struct MoeFixture {
  MemoryLedger ledger;
  HostAllocator allocator{ledger};
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  SingleProcessExchange exchange;
  std::vector<LayerSpec> specs;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<MoeLayer> layer;
  std::vector<float> input, loss_weights;
  MoeActivations saved;
  MoeStatistics statistics;

  MoeFixture(int experts, int top_k) {
    specs = model_layer_specs(3, hidden, hidden, 2, 1, experts, top_k);
    store = std::make_unique<ParameterStore>(model_parameter_tensors(specs, 1, 2), allocator);
    initialize_state(store_placement(*store, {}, {}), 5, allocator, allocator);
    layer = std::make_unique<MoeLayer>(*store, specs[1], "layers/01",
                                       MoeSettings{.capacity_factor = 0, .aux_loss_coef = 0.3});
    input = values(rows * hidden, 1, 1.5f);
    loss_weights = values(rows * hidden, 2, 1.0f);
  }

  static std::vector<float> values(std::int64_t count, std::uint64_t seed, float scale) {
    std::vector<float> result(static_cast<std::size_t>(count));
    CounterRng(seed, "moe-test").fill_uniform(result.data(), 0, result.size(), -scale, scale);
    return result;
  }

  MoeLayer::Pass pass() { return {*kernels, allocator, exchange}; }

  // sum(output * R) + the auxiliary loss; `routing` receives the chosen (token, expert) pairs.
  double loss(std::vector<std::int32_t>* routing = nullptr) {
    std::vector<float> output(rows * hidden);
    statistics.clear();
    saved = MoeActivations{};
    layer->forward(pass(), input.data(), rows, output.data(), saved, &statistics);
    if (routing != nullptr) {
      *routing = saved.routing.token;
      routing->insert(routing->end(), saved.routing.expert.begin(), saved.routing.expert.end());
    }
    double sum = statistics.aux_loss;
    for (std::size_t i = 0; i < output.size(); ++i) sum += static_cast<double>(output[i]) * loss_weights[i];
    return sum;
  }

  std::vector<float> backward(bool accumulate) {
    loss();
    std::vector<float> grad_input(rows * hidden);
    layer->backward(pass(), input.data(), loss_weights.data(), rows, grad_input.data(), saved,
                    accumulate, 1);
    return grad_input;
  }

  // Checks d loss / d *value against a central difference, unless the step changes the routing
  // (where the loss is not differentiable). Returns whether it checked.
  bool check(float* value, float analytic) {
    std::vector<std::int32_t> base, plus_routing, minus_routing;
    loss(&base);
    const float saved_value = *value, step = 1e-2f;
    *value = saved_value + step;
    const double plus = loss(&plus_routing);
    *value = saved_value - step;
    const double minus = loss(&minus_routing);
    *value = saved_value;
    if (plus_routing != base || minus_routing != base) return false;
    const double numeric = (plus - minus) / (2.0 * step);
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric)));
    return true;
  }

  float* parameter(const std::string& name) const {
    return static_cast<float*>(store->value_at(store->tensor("layers/01/" + name).offset));
  }
  float* gradient(const std::string& name) const {
    return static_cast<float*>(store->grad_at(store->tensor("layers/01/" + name).offset));
  }
};

void check_backward(int experts, int top_k) {
  MoeFixture fixture(experts, top_k);
  const std::vector<float> grad_input = fixture.backward(false);
  const std::vector<float> router_grad(fixture.gradient("router/weight"),
                                       fixture.gradient("router/weight") + experts * hidden);
  const std::vector<float> weight_grad(fixture.gradient("experts/weight"),
                                       fixture.gradient("experts/weight") + experts * hidden * hidden);
  const std::vector<float> bias_grad(fixture.gradient("experts/bias"),
                                     fixture.gradient("experts/bias") + experts * hidden);
  int checked = 0, total = 0;
  const auto each = [&](float* values, const std::vector<float>& analytic) {
    for (std::size_t i = 0; i < analytic.size(); ++i, ++total)
      checked += fixture.check(values + i, analytic[i]) ? 1 : 0;
  };
  each(fixture.input.data(), grad_input);
  each(fixture.parameter("router/weight"), router_grad);
  each(fixture.parameter("experts/weight"), weight_grad);
  each(fixture.parameter("experts/bias"), bias_grad);
  // Nearly every element is away from a routing change.
  EXPECT_GE(checked, total * 9 / 10);
}

}  // namespace

TEST(Moe, BackwardMatchesFiniteDifferencesWithEveryExpertChosen) { check_backward(3, 3); }
TEST(Moe, BackwardMatchesFiniteDifferencesWithTopTwoOfFour) { check_backward(4, 2); }
TEST(Moe, BackwardMatchesFiniteDifferencesWithTopOne) { check_backward(4, 1); }

TEST(Moe, SecondMicroBatchAccumulates) {
  MoeFixture fixture(4, 2);
  fixture.backward(false);
  const std::int64_t count = 4 * hidden * hidden;
  const std::vector<float> first(fixture.gradient("experts/weight"),
                                 fixture.gradient("experts/weight") + count);
  const float router_first = fixture.gradient("router/weight")[3];
  fixture.backward(true);
  for (std::int64_t i = 0; i < count; ++i)
    EXPECT_NEAR(fixture.gradient("experts/weight")[i], 2 * first[i], 1e-5);
  EXPECT_NEAR(fixture.gradient("router/weight")[3], 2 * router_first, 1e-5);
}

TEST(Moe, CapacityKeepsTheFirstAssignmentsOfEachExpert) {
  MoeFixture fixture(4, 2);
  fixture.layer = std::make_unique<MoeLayer>(*fixture.store, fixture.specs[1], "layers/01",
                                             MoeSettings{.capacity_factor = 0.5, .aux_loss_coef = 0});
  std::vector<float> output(rows * hidden);
  fixture.layer->forward(fixture.pass(), fixture.input.data(), rows, output.data(), fixture.saved,
                         &fixture.statistics);
  // Each token's top two experts by probability (ties to the lower index), from the router's
  // probabilities; ceil(0.5 * 2 * 6 / 4) = 2 per expert: the first two tokens of each are kept.
  const float* p = fixture.saved.probabilities.floats();
  std::vector<std::vector<std::int32_t>> chosen_by(4);
  for (std::int32_t token = 0; token < rows; ++token) {
    std::vector<int> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[token * 4 + a] > p[token * 4 + b]; });
    for (int choice = 0; choice < 2; ++choice) chosen_by[order[choice]].push_back(token);
  }
  const MoeRouting& routing = fixture.saved.routing;
  const auto& load = fixture.statistics.expert_load.at(1);
  double dropped = 0;
  for (int expert = 0; expert < 4; ++expert) {
    std::vector<std::int32_t> kept;
    for (std::int64_t i = 0; i < routing.kept(); ++i)
      if (routing.expert[i] == expert) kept.push_back(routing.token[i]);
    const auto& candidates = chosen_by[expert];
    EXPECT_EQ(load[expert], static_cast<double>(candidates.size()));
    EXPECT_EQ(kept, std::vector<std::int32_t>(candidates.begin(),
                                              candidates.begin() + std::min<std::size_t>(2, candidates.size())));
    dropped += std::max(0.0, load[expert] - 2);
  }
  EXPECT_EQ(fixture.statistics.dropped, dropped);
  EXPECT_GT(dropped, 0);
}
