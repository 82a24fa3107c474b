// Optimizer room: the learning rate's schedules, clipping, AdamW (with fp32 masters of 16-bit
// parameters) and fp16's loss scale.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/half_float.hpp"
#include "optimizer/loss_scaler.hpp"
#include "optimizer/optimizer.hpp"

using namespace mlptrain;

TEST(LearningRate, WarmupThenConstantOrCosine) {
  Config config;
  config.training.lr = 0.1;
  config.training.steps = 10;
  config.training.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(config, 0), 0.025);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(config, 3), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(config, 9), 0.1);
  config.training.lr_schedule = LearningRateSchedule::cosine;
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(config, 4), 0.1);
  EXPECT_NEAR(scheduled_learning_rate(config, 7), 0.1 * 0.5 * (1 + std::cos(std::numbers::pi * 3 / 6)), 1e-15);
  config.training.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(config, 0), 0.1);
}

TEST(Clipping, CoefficientAsTorch) {
  EXPECT_DOUBLE_EQ(clip_coefficient(1.0, 0.5), 1.0);
  EXPECT_NEAR(clip_coefficient(1.0, 4.0), 1.0 / (4.0 + 1e-6), 1e-15);
}

TEST(AdamW, TwoStepsByHand) {
  // One parameter, torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
  // p0 = 1, g = 0.5 then -0.25. Step 1: m = 0.05, v = 0.00025, m_hat = 0.5, v_hat = 0.25,
  // p = 1 * (1 - 0.001) - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899 (to 1e-8).
  Config config;
  config.training.lr = 0.1;
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  auto kernels = make_cpu_kernels();
  std::vector<ParameterTensor> tensors = {{.path = "p", .global_shape = {1}, .local_start = {0},
                                           .local_shape = {1}, .offset = 0, .count = 1}};
  ParameterStore store(tensors, allocator);
  StatePlacement placement = store_placement(store, {}, {});
  float* value = static_cast<float*>(store.values());
  float* grad = static_cast<float*>(store.grads());
  value[0] = 1.0f;
  AdamW optimizer(config, allocator, placement);
  EXPECT_EQ(ledger.current(MemoryState::optimizer), 8);
  grad[0] = 0.5f;
  EXPECT_DOUBLE_EQ(optimizer.update(*kernels, placement, 0.1, 1), 0.25);
  EXPECT_NEAR(value[0], 0.899, 1e-6);
  // Step 2: m = 0.9*0.05 - 0.025 = 0.02, v = 0.999*0.00025 + 0.0000625 = 0.00031225,
  // m_hat = 0.02/0.19, v_hat = 0.00031225/0.001999; p = 0.899*0.999 - 0.1*m_hat/(sqrt(v_hat)+eps).
  grad[0] = -0.25f;
  optimizer.update(*kernels, placement, 0.1, 2);
  const double m_hat = 0.02 / 0.19, v_hat = 0.00031225 / (1 - 0.999 * 0.999);
  EXPECT_NEAR(value[0], 0.899 * 0.999 - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8), 1e-6);
}

TEST(AdamW, HalfParametersKeepFloatMastersAndTheirRoundedCopy) {
  Config config;
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  auto kernels = make_cpu_kernels();
  const auto specs = model_layer_specs(2, 6, 8, 3);
  const Precision precision{.param = DataType::bfloat16, .reduce = DataType::float32};
  ParameterStore store(model_parameter_tensors(specs, 0, 2), allocator, {}, precision);
  StatePlacement placement = store_placement(store, {}, {});
  AdamW optimizer(config, allocator, placement);
  initialize_state(placement, 3, allocator, allocator);
  // The optimizer holds master, exp_avg and exp_avg_sq: 12 bytes a parameter; the values 2, the
  // gradients 4.
  EXPECT_EQ(ledger.current(MemoryState::optimizer), static_cast<std::int64_t>(12 * store.size()));
  EXPECT_EQ(ledger.current(MemoryState::params), static_cast<std::int64_t>(2 * store.size()));
  EXPECT_EQ(ledger.current(MemoryState::grads), static_cast<std::int64_t>(4 * store.size()));
  // Init draws the masters as an fp32 run draws its values; the values are them rounded.
  ParameterStore fp32_store(model_parameter_tensors(specs, 0, 2), allocator);
  initialize_state(store_placement(fp32_store, {}, {}), 3, allocator, allocator);
  const auto check_copies = [&] {
    for (const StateRange& run : placement.updated)
      for (std::int64_t i = 0; i < run.count; ++i)
        ASSERT_EQ(load_element(run.values, static_cast<std::size_t>(i), DataType::bfloat16),
                  bfloat16_to_float(round_to_bfloat16(run.master[i])));
  };
  for (const StateRange& run : placement.updated)
    for (std::int64_t i = 0; i < run.count; ++i)
      ASSERT_EQ(run.master[i], static_cast<const float*>(fp32_store.values())[run.tensor->offset + i]);
  check_copies();
  kernels->fill(store.grads(), DataType::float32, store.size(), 0.125f);
  const std::vector<float> before(placement.updated.front().master, placement.updated.front().master + 4);
  optimizer.update(*kernels, placement, 1e-2, 1);
  EXPECT_NE(placement.updated.front().master[0], before[0]);  // the fp32 master moved by ~lr
  check_copies();
}

TEST(LossScaler, DynamicScaleHalvesOnOverflowAndDoublesAfterTheWindow) {
  Config config;
  config.precision.param_dtype = DataType::float16;
  config.precision.loss_scale = 0;
  config.precision.initial_loss_scale = 8;
  config.precision.loss_scale_window = 2;
  config.precision.min_loss_scale = 2;
  LossScaler scaler(config);
  ASSERT_TRUE(scaler.scales() && scaler.dynamic());
  std::vector<float> seen;
  for (bool finite : {true, false, false, false, true, true, true, false}) {
    seen.push_back(scaler.scale());
    finite ? scaler.finite_step() : scaler.overflowed_step();
  }
  EXPECT_EQ(seen, (std::vector<float>{8, 8, 4, 2, 2, 2, 4, 4}));  // never below the minimum 2
  EXPECT_EQ(scaler.skipped_steps(), 4);
  EXPECT_EQ(scaler.scale(), 2);
  config.precision.loss_scale = 128;  // fixed
  LossScaler fixed(config);
  fixed.finite_step();
  fixed.finite_step();
  fixed.finite_step();
  EXPECT_FALSE(fixed.dynamic());
  EXPECT_EQ(fixed.scale(), 128);
  EXPECT_FALSE(LossScaler(Config{}).scales());
  EXPECT_EQ(LossScaler(Config{}).scale(), 1);
}
