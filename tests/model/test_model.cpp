// Model room: Linear layers and losses against finite differences, layout-independent init.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "core/rng.hpp"
#include "model/linear.hpp"
#include "model/loss.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"
#include "model/state_ranges.hpp"

using namespace mlptrain;

namespace {

std::vector<float> random_values(std::size_t count, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> values(count);
  CounterRng(seed, "model-test").fill_uniform(values.data(), 0, count, -scale, scale);
  return values;
}

// Central difference of f with respect to *value.
double numeric_derivative(float* value, const std::function<double()>& f, float step = 1e-2f) {
  const float saved = *value;
  *value = saved + step;
  const double plus = f();
  *value = saved - step;
  const double minus = f();
  *value = saved;
  return (plus - minus) / (2.0 * step);
}

struct LayerFixture {
  MemoryLedger ledger;
  HostAllocator allocator{ledger};
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  std::vector<LayerSpec> specs;
  std::unique_ptr<ParameterStore> store;
  LinearLayer layer;

  explicit LayerFixture(bool gelu) {
    specs = {{.index = 0, .in_features = 5, .out_features = 4, .gelu = gelu},
             {.index = 1, .in_features = 4, .out_features = 3, .gelu = false}};
    store = std::make_unique<ParameterStore>(model_parameter_tensors(specs, 0, 1), allocator);
    initialize_state(store_placement(*store, {}, {}), 11, allocator, allocator);
    layer = linear_layer_view(*store, specs[0], "layers/00");
  }
};

void check_linear_backward(bool gelu) {
  LayerFixture fixture(gelu);
  const std::int64_t rows = 3, in = 5, out = 4;
  auto input = random_values(rows * in, 1, 2.0f);
  const auto weights_of_loss = random_values(rows * out, 2);  // loss = sum(output * R)
  std::vector<float> pre(rows * out), activated(rows * out);
  const auto loss = [&] {
    linear_forward_matmul(*fixture.kernels, fixture.layer, input.data(), rows, pre.data());
    linear_forward_finish(*fixture.kernels, fixture.layer, rows, pre.data(), activated.data());
    const auto& output = gelu ? activated : pre;
    double sum = 0;
    for (std::size_t i = 0; i < output.size(); ++i) sum += static_cast<double>(output[i]) * weights_of_loss[i];
    return sum;
  };
  loss();
  std::vector<float> grad_pre(rows * out), grad_input(rows * in);
  linear_backward(*fixture.kernels, fixture.layer, input.data(), pre.data(), weights_of_loss.data(),
                  rows, grad_pre.data(), grad_input.data(), false);
  const auto close = [](double analytic, double numeric) {
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric)));
  };
  float* weight = static_cast<float*>(fixture.layer.weight);
  float* weight_grad = static_cast<float*>(fixture.layer.weight_grad);
  for (std::int64_t i = 0; i < out * in; ++i) close(weight_grad[i], numeric_derivative(weight + i, loss));
  for (std::int64_t i = 0; i < out; ++i)
    close(static_cast<float*>(fixture.layer.bias_grad)[i],
          numeric_derivative(static_cast<float*>(fixture.layer.bias) + i, loss));
  for (std::int64_t i = 0; i < rows * in; ++i)
    close(grad_input[i], numeric_derivative(input.data() + i, loss));

  // A second micro-batch accumulates onto the first.
  loss();  // restores pre after the perturbed forwards
  const std::vector<float> first(weight_grad, weight_grad + out * in);
  linear_backward(*fixture.kernels, fixture.layer, input.data(), pre.data(), weights_of_loss.data(),
                  rows, grad_pre.data(), nullptr, true);
  for (std::int64_t i = 0; i < out * in; ++i)
    EXPECT_NEAR(weight_grad[i], 2 * first[i], 1e-5);
}

}  // namespace

TEST(Linear, BackwardWithGeluMatchesFiniteDifferences) { check_linear_backward(true); }
TEST(Linear, BackwardWithoutActivationMatchesFiniteDifferences) { check_linear_backward(false); }

TEST(Loss, GradientsMatchFiniteDifferencesOfTheGlobalMean) {
  auto kernels = make_cpu_kernels();
  const std::int64_t rows = 4, cols = 3, global_samples = 10;
  auto output = random_values(rows * cols, 3, 2.0f);
  const auto targets = random_values(rows * cols, 4);
  const std::vector<std::int32_t> labels = {2, 0, 1, 2};
  for (LossKind kind : {LossKind::mse, LossKind::cross_entropy}) {
    std::vector<float> grad(rows * cols);
    compute_loss(*kernels, kind, output.data(), targets.data(), labels.data(), rows, cols,
                 global_samples, grad.data());
    const auto mean_loss = [&] {
      const LossSums sums = compute_loss(*kernels, kind, output.data(), targets.data(),
                                         labels.data(), rows, cols, global_samples, nullptr);
      return sums.loss_sum / loss_normalizer(kind, global_samples, cols);
    };
    for (std::int64_t i = 0; i < rows * cols; ++i)
      EXPECT_NEAR(grad[i], numeric_derivative(output.data() + i, mean_loss, 1e-2f), 1e-4);
  }
}

TEST(ModelSpec, LayerShapesAndPaths) {
  const auto specs = model_layer_specs(4, 7, 16, 3);
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].in_features, 7);
  EXPECT_EQ(specs[0].out_features, 16);
  EXPECT_EQ(specs[3].in_features, 16);
  EXPECT_EQ(specs[3].out_features, 3);
  EXPECT_TRUE(specs[2].gelu);
  EXPECT_FALSE(specs[3].gelu);
  EXPECT_EQ(layer_path(3, 4), "layers/03");
  EXPECT_EQ(layer_path(7, 120), "layers/007");
  EXPECT_EQ(parameter_count(specs), 7 * 16 + 16 + 2 * (16 * 16 + 16) + 16 * 3 + 3);
}

TEST(ParameterStore, FlatLayoutAndInitBounds) {
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  const auto specs = model_layer_specs(3, 6, 8, 2);
  ParameterStore store(model_parameter_tensors(specs, 0, 3), allocator);
  initialize_state(store_placement(store, {}, {}), 5, allocator, allocator);
  const std::size_t expected = 8 * 6 + 8 + 8 * 8 + 8 + 2 * 8 + 2;
  EXPECT_EQ(store.size(), expected);
  EXPECT_EQ(ledger.current(MemoryState::params), static_cast<std::int64_t>(expected * 4));
  EXPECT_EQ(ledger.current(MemoryState::grads), static_cast<std::int64_t>(expected * 4));
  const FlatRange middle = store.unit_range(1);
  EXPECT_EQ(middle.offset, 8u * 6 + 8);
  EXPECT_EQ(middle.count, 8u * 8 + 8);
  for (const ParameterTensor& tensor : store.tensors()) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(specs[tensor.layer].in_features));
    for (std::size_t i = 0; i < tensor.count; ++i)
      ASSERT_LE(std::abs(static_cast<const float*>(store.values())[tensor.offset + i]), bound);
  }
}

TEST(ParameterStore, UnitsArePaddedToTheAskedMultipleAndMemoryFollowsThePlan) {
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  const auto specs = model_layer_specs(3, 6, 8, 2);  // units of 56, 72 and 18 elements
  const ParameterPlan plan{.unit_multiple = 4, .hold_values = true, .hold_grads = false};
  ParameterStore store(model_parameter_tensors(specs, 0, 3, plan), allocator, plan);
  EXPECT_EQ(store.unit_range(0).count, 56u);
  EXPECT_EQ(store.unit_range(1).offset, 56u);
  EXPECT_EQ(store.unit_range(2).offset, 128u);
  EXPECT_EQ(store.unit_range(2).count, 20u);  // 18 padded to 20
  EXPECT_EQ(store.size(), 148u);
  EXPECT_EQ(ledger.current(MemoryState::params), 148 * 4);
  EXPECT_EQ(ledger.current(MemoryState::grads), 0);
  EXPECT_EQ(store.grads(), nullptr);
}

TEST(ParameterStore, AShardGeneratedAloneEqualsTheSliceOfTheWhole) {
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  const auto specs = model_layer_specs(2, 9, 7, 3);
  ParameterStore whole(model_parameter_tensors(specs, 0, 2), allocator);
  initialize_state(store_placement(whole, {}, {}), 42, allocator, allocator);
  // A box of rows [2, 6) and columns [3, 8) of layer 0's weight, as a tensor-parallel rank holds.
  ParameterTensor shard = whole.tensor("layers/00/weight");
  shard.local_start = {2, 3};
  shard.local_shape = {4, 5};
  shard.offset = 0;
  shard.count = 20;
  ParameterStore alone({shard}, allocator);
  initialize_state(store_placement(alone, {}, {}), 42, allocator, allocator);
  const float* full = static_cast<const float*>(whole.value_at(whole.tensor("layers/00/weight").offset));
  for (int row = 0; row < 4; ++row)
    for (int col = 0; col < 5; ++col)
      EXPECT_EQ(static_cast<const float*>(alone.values())[row * 5 + col], full[(2 + row) * 9 + 3 + col]);
  // And a flat range cutting through rows, as a ZeRO shard holds it.
  float piece[17];
  const StateRange run{.tensor = &whole.tensor("layers/00/weight"), .offset = 13, .count = 17, .values = piece};
  initialize_state({.held = {run}}, 42, allocator, allocator);
  for (int i = 0; i < 17; ++i) EXPECT_EQ(piece[i], full[13 + i]);
}

TEST(ParameterStore, RunsOfBoxesInRowMajorOrder) {
  std::vector<std::array<std::int64_t, 3>> runs;
  const auto record = [&](std::int64_t global, std::int64_t local, std::int64_t count) {
    runs.push_back({global, local, count});
  };
  for_each_run({4, 6}, {1, 2}, {2, 3}, record);
  EXPECT_EQ(runs, (std::vector<std::array<std::int64_t, 3>>{{8, 0, 3}, {14, 3, 3}}));
  runs.clear();
  for_each_run({4, 6}, {1, 0}, {3, 6}, record);  // whole rows: one run
  EXPECT_EQ(runs, (std::vector<std::array<std::int64_t, 3>>{{6, 0, 18}}));
  runs.clear();
  for_each_run({2, 3, 4}, {1, 0, 1}, {1, 2, 2}, record);
  EXPECT_EQ(runs, (std::vector<std::array<std::int64_t, 3>>{{13, 0, 2}, {17, 2, 2}}));
  runs.clear();
  for_each_run({4, 6}, {4, 0}, {0, 6}, record);  // an empty box has no runs
  EXPECT_TRUE(runs.empty());
}

// Each distinct part of a tensor (one per tensor-parallel rank, or one when it is replicated
// there) has copies numbered 0..count-1 on the ranks holding it, and one of them counts it.
TEST(ParameterStore, CopiesOfATensorAreNumberedOnceEach) {
  const auto specs = model_layer_specs(3, 4, 4, 2);
  const auto tensors = model_parameter_tensors(specs, 0, 3);
  const GridShape shape{.world = 6, .tp = 2, .dp = 3, .pp = 1, .ep = 1};
  for (const ParameterTensor& tensor : tensors) {
    std::map<int, std::set<int>> indices_by_part;  // part: the tensor-parallel rank, or 0
    int counting = 0;
    for (int rank = 0; rank < shape.world; ++rank) {
      const GridCoordinates place = coordinates_of(shape, rank);
      const RangeCopies copies = ParameterStore::copies_of(tensor, shape, place);
      EXPECT_EQ(copies.count, tensor.replicated_over_tensor ? shape.world : shape.dp) << tensor.path;
      indices_by_part[tensor.replicated_over_tensor ? 0 : place.tp].insert(copies.index);
      counting += copies.index == tensor.global_index % copies.count ? 1 : 0;
    }
    for (const auto& [part, indices] : indices_by_part) {
      EXPECT_EQ(static_cast<int>(indices.size()), shape.world / static_cast<int>(indices_by_part.size()));
      EXPECT_EQ(*indices.rbegin(), static_cast<int>(indices.size()) - 1) << tensor.path;
    }
    EXPECT_EQ(counting, static_cast<int>(indices_by_part.size())) << tensor.path;
  }
}
