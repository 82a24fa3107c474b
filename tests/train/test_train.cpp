// Train room: options, schedules of the learning rate, clipping, AdamW (with fp32 masters of 16-bit
// parameters) and fp16's loss scale.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include "core/error.hpp"
#include "core/half_float.hpp"
#include "layout/options.hpp"
#include "strategies/pipeline/pipeline_options.hpp"
#include "strategies/strategy.hpp"
#include "strategies/tensor/tensor_options.hpp"
#include "strategies/zero/zero_options.hpp"
#include "train/loss_scaler.hpp"
#include "train/optimizer.hpp"

using namespace mlptrain;

namespace {

Config parsed(std::vector<std::string> arguments, int world = 1) {
  ParsedOptions options = parse_options(arguments);
  validate_options(options.config, world);
  return options.config;
}

// The message of the UsageError that parsing and validating `arguments` throws.
std::string usage_error(std::vector<std::string> arguments, int world = 1) {
  try {
    parsed(std::move(arguments), world);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Options, DefaultsAndOverrides) {
  const Config config = parsed({"--layers", "6", "--lr", "0.01", "--shuffle", "--dataset", "mixture"}, 4);
  EXPECT_EQ(config.model.layers, 6);
  EXPECT_DOUBLE_EQ(config.training.lr, 0.01);
  EXPECT_TRUE(config.data.shuffle);
  EXPECT_EQ(config.data.kind, DatasetKind::mixture);
  EXPECT_EQ(config.grid.dp, 4);  // world / (tp * pp)
  EXPECT_EQ(config.model.hidden, Config{}.model.hidden);
}

TEST(Options, HelpListsEveryOption) {
  const ParsedOptions options = parse_options({"--help"});
  EXPECT_TRUE(options.help);
  for (const char* name : {"--layers", "--capacity-factor", "--data-path", "--grad-clip",
                           "--zero", "--comm", "--predict", "--config"})
    EXPECT_NE(options.help_text.find(name), std::string::npos) << name;
}

// What a strategy's registration declares reaches --help, INI text and its field, and its rules run.
TEST(Options, EveryStrategysOwnOptionsAreParsedAndWrittenBack) {
  const ParsedOptions help = parse_options({"--help"});
  int declared = 0;
  for (const StrategyRegistration& strategy : strategy_registry())
    for (const Option& option : strategy.options) {
      ++declared;
      const std::string name(option.name);
      EXPECT_NE(help.help_text.find("--" + name + " "), std::string::npos) << name;
      EXPECT_NE(to_ini(Config{}).find("\n" + name + " = "), std::string::npos) << name;
    }
  EXPECT_GE(declared, 5);  // ZeRO's two, sequence parallelism, the pipeline's schedule and chunks
  const Config config = parsed({"--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--micro-batches",
                                "4", "--zero", "2", "--zero-shard-size", "1", "--sequence-parallel", "--tp", "2",
                                "--global-batch", "64", "--layers", "8"}, 8);
  EXPECT_EQ(config.strategies.get<PipelineOptions>().schedule.get().name, "interleaved");
  EXPECT_EQ(config.strategies.get<PipelineOptions>().virtual_stages, 2);
  EXPECT_EQ(config.strategies.get<ZeroOptions>().stage, 2);
  EXPECT_EQ(config.strategies.get<ZeroOptions>().shard_size, 1);
  EXPECT_TRUE(config.strategies.get<TensorParallelOptions>().sequence_parallel);
  // Each strategy's rules: the pipeline's schedule table, ZeRO's stage range.
  EXPECT_THROW(parsed({"--pp", "2", "--schedule", "zb-v2"}, 2), UsageError);
  EXPECT_THROW(parsed({"--zero", "4"}, 2), UsageError);
}

TEST(Options, IniFileIsReadAndCommandLineWins) {
  const std::string path = ::testing::TempDir() + "options_test.ini";
  {
    std::ofstream ini(path);
    ini << "# comment\nlayers = 5\nhidden = 64\nshuffle = true\nlr = 0.5\n";
  }
  const Config config = parsed({"--config", path, "--hidden", "32"});
  EXPECT_EQ(config.model.layers, 5);
  EXPECT_EQ(config.model.hidden, 32);
  EXPECT_TRUE(config.data.shuffle);
  EXPECT_DOUBLE_EQ(config.training.lr, 0.5);
}

TEST(Options, SwitchesSetInAnIniFileCanBeTurnedOffOnTheCommandLine) {
  const std::string path = ::testing::TempDir() + "switches.ini";
  std::ofstream(path) << "shuffle = true\n";
  EXPECT_TRUE(parsed({"--config", path}).data.shuffle);
  EXPECT_FALSE(parsed({"--config", path, "--shuffle=false"}).data.shuffle);
}

TEST(Options, IniTextRoundTrips) {
  Config config = parsed({"--layers", "7", "--lr", "0.000123456789", "--dataset", "mixture",
                          "--lr-schedule", "cosine", "--grad-clip", "0.3", "--shuffle"}, 2);
  const std::string path = ::testing::TempDir() + "round_trip.ini";
  std::ofstream(path) << to_ini(config);
  const Config again = parsed({"--config", path}, 2);
  EXPECT_EQ(to_ini(again), to_ini(config));
  EXPECT_DOUBLE_EQ(again.training.lr, 0.000123456789);
}

TEST(Options, BadInputNamesTheOption) {
  EXPECT_NE(usage_error({"--no-such-flag"}).find("no-such-flag"), std::string::npos);
  EXPECT_NE(usage_error({"--layers", "abc"}).find("--layers"), std::string::npos);
  EXPECT_NE(usage_error({"--layers", "1"}).find("--layers must be at least 2"), std::string::npos);
  EXPECT_NE(usage_error({"--dataset", "imagenet"}).find("unknown value 'imagenet'"), std::string::npos);
  EXPECT_NE(usage_error({"--global-batch", "10", "--micro-batches", "3"}).find("--micro-batches 3"),
            std::string::npos);
  EXPECT_NE(usage_error({"--global-batch", "6"}, 4).find("not divisible by dp 4"), std::string::npos);
  EXPECT_NE(usage_error({"--dp", "3"}, 4).find("world size 4"), std::string::npos);
  EXPECT_NE(usage_error({"--beta2", "1.5"}).find("--beta2"), std::string::npos);
  EXPECT_NE(usage_error({"--dataset", "hdf5"}).find("--data-path"), std::string::npos);
  EXPECT_NE(usage_error({"--data-path", "x.h5"}).find("--data-path"), std::string::npos);
  EXPECT_NE(usage_error({"--save-every", "5"}).find("--checkpoint-dir"), std::string::npos);
  EXPECT_NE(usage_error({"--top-k", "9"}).find("--top-k 9"), std::string::npos);
  EXPECT_NE(usage_error({"--config", "/no/such/file.ini"}).find("/no/such/file.ini"), std::string::npos);
  EXPECT_NE(usage_error({"--lr", "nan"}).find("--lr"), std::string::npos);
  EXPECT_NE(usage_error({"--hidden", "300000000"}).find("--hidden must be at most"), std::string::npos);
}

TEST(Options, MalformedIniIsAUsageError) {
  const std::string path = ::testing::TempDir() + "malformed.ini";
  std::ofstream(path) << "layers 5\n";
  EXPECT_NE(usage_error({"--config", path}).find(path), std::string::npos);
  std::ofstream(path) << "unknown-option = 3\n";
  EXPECT_NE(usage_error({"--config", path}).find("unknown-option"), std::string::npos);
  std::ofstream(path) << "config = other.ini\n";  // files do not chain
  EXPECT_NE(usage_error({"--config", path}).find("config"), std::string::npos);
}

TEST(Options, InconsistentFeaturesAreRefusedByName) {
  // Each tensor rank holds an equal slice of its expert-parallel rank's experts.
  EXPECT_NE(usage_error({"--moe-every", "1", "--experts", "6", "--tp", "4"}, 4).find("--experts 6 is not divisible"),
            std::string::npos);
  EXPECT_NE(usage_error({"--zero", "4"}).find("--zero must be"), std::string::npos);
  EXPECT_NE(usage_error({"--offload"}).find("needs --device cuda"), std::string::npos);
  EXPECT_NE(usage_error({"--tf32"}).find("needs --device cuda"), std::string::npos);
  EXPECT_NE(usage_error({"--comm", "nccl"}).find("needs --device cuda"), std::string::npos);
  EXPECT_NE(usage_error({"--offload", "--device", "cpu"}).find("needs --device cuda"), std::string::npos);
  EXPECT_TRUE(parsed({"--device", "loopback", "--offload"}, 1).device.offload);
  EXPECT_EQ(parsed({"--device", "loopback", "--tp", "2"}, 2).device.kind, Device::loopback);
  EXPECT_TRUE(parsed({"--recompute", "--pp", "2", "--zero", "3"}, 4).training.recompute);
}

TEST(Options, PipelineNeedsALayerPerStageAndAKnownSchedule) {
  EXPECT_EQ(parsed({"--pp", "2", "--layers", "2"}, 2).grid.pp, 2);
  EXPECT_NE(usage_error({"--pp", "4", "--layers", "3"}, 4).find("--pp 4 needs at least one layer per stage"),
            std::string::npos);
  EXPECT_NE(usage_error({"--pp", "2", "--schedule", "zigzag"}, 2).find("unknown value 'zigzag'"),
            std::string::npos);
  EXPECT_EQ(parsed({"--pp", "2", "--global-batch", "8", "--micro-batches", "4"}, 4).grid.dp, 2);
  EXPECT_NE(usage_error({"--pp", "2", "--global-batch", "8", "--micro-batches", "8"}, 4).find("dp 2"),
            std::string::npos);
}

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
    for (const StateRun& run : placement.updated)
      for (std::int64_t i = 0; i < run.count; ++i)
        ASSERT_EQ(load_element(run.values, static_cast<std::size_t>(i), DataType::bfloat16),
                  bfloat16_to_float(round_to_bfloat16(run.master[i])));
  };
  for (const StateRun& run : placement.updated)
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

TEST(Options, PrecisionNeedsOneHalfFormatAndScalesOnlyFp16) {
  const Config bf16 = parsed({"--param-dtype", "bf16"});
  EXPECT_EQ(bf16.precision.types().optimizer_bytes(), 12u);
  EXPECT_FALSE(bf16.precision.types().scales_loss());
  const Config fp16 = parsed({"--param-dtype", "fp16"});
  EXPECT_EQ(fp16.precision.loss_scale, 0);  // dynamic by default
  EXPECT_EQ(fp16.precision.initial_loss_scale, 65536);
  EXPECT_EQ(fp16.precision.loss_scale_window, 1000);
  EXPECT_EQ(fp16.precision.min_loss_scale, 1);
  EXPECT_NE(usage_error({"--param-dtype", "bf16", "--reduce-dtype", "fp16"}).find("--reduce-dtype fp16"), std::string::npos);
  EXPECT_NE(usage_error({"--param-dtype", "fp8"}).find("--param-dtype"), std::string::npos);
  EXPECT_NE(usage_error({"--loss-scale", "128"}).find("--loss-scale"), std::string::npos);
  EXPECT_NE(usage_error({"--param-dtype", "fp16", "--loss-scale", "0.5"}).find("--loss-scale"), std::string::npos);
}
