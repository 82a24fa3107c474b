// Layout room: the options of mlptrain (parsing, INI files, --help, each strategy's own options)
// and their validation.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.hpp"
#include "command_line/parser.hpp"
#include "strategies/pipeline_parallel/pipeline_options.hpp"
#include "strategies/registration.hpp"
#include "strategies/tensor_parallel/tensor_options.hpp"
#include "strategies/zero/zero_options.hpp"

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

// --help shows the value a run uses, not the sentinel stored for "decided later": the numbers it
// names for fp16 are the ones an fp16 run gets, and dp shows how it is derived.
TEST(Options, HelpShowsTheDefaultsARunUses) {
  const std::string help = parse_options({"--help"}).help_text;
  const Config fp16 = parsed({"--param-dtype", "fp16"});
  const std::pair<std::string, double> scales[] = {
      {"--loss-scale arg (=0 for fp16)", fp16.precision.loss_scale},
      {"--initial-loss-scale arg (=65536 for fp16)", fp16.precision.initial_loss_scale},
      {"--loss-scale-window arg (=1000 for fp16)", fp16.precision.loss_scale_window},
      {"--min-loss-scale arg (=1 for fp16)", fp16.precision.min_loss_scale}};
  for (const auto& [line, value] : scales) {
    EXPECT_NE(help.find(line), std::string::npos) << line;
    EXPECT_EQ(std::stod(line.substr(line.find("(=") + 2)), value) << line;
  }
  EXPECT_NE(help.find("--dp arg (=derived: world / (tp pp))"), std::string::npos);
  EXPECT_EQ(parsed({"--tp", "2"}, 8).grid.dp, 4);
  EXPECT_EQ(help.find("(=-1)"), std::string::npos);  // no sentinel shown as a default
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
