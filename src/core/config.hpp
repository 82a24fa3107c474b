// The run's configuration as plain data: every option of DESIGN.md §2.3 in its section, closed
// sets of choices as enums with the names users write, and the strategies' own options as typed
// blocks they declare. Parsing and validation live in src/command_line/options.*; everything else reads
// this struct.
#pragma once

#include <any>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>

#include "core/buffer.hpp"
#include "core/precision.hpp"

namespace mlptrain {

enum class DatasetKind { teacher, mixture, hdf5 };
enum class LearningRateSchedule { constant, cosine };
enum class OnNonFinite { stop, skip };  // a non-finite loss or gradient: stop, or skip the update
enum class CommBackend { mpi, nccl };
// A checkpoint's writes: behind training on a thread of their own, or before training goes on.
enum class SaveMode { async, sync };

// The names of each closed set's choices, as options and INI files spell them.
template <typename Choice>
struct ChoiceNames;
template <> struct ChoiceNames<DatasetKind> {
  static constexpr std::array<std::pair<DatasetKind, std::string_view>, 3> names = {
      {{DatasetKind::teacher, "teacher"}, {DatasetKind::mixture, "mixture"}, {DatasetKind::hdf5, "hdf5"}}};
};
template <> struct ChoiceNames<LearningRateSchedule> {
  static constexpr std::array<std::pair<LearningRateSchedule, std::string_view>, 2> names = {
      {{LearningRateSchedule::constant, "constant"}, {LearningRateSchedule::cosine, "cosine"}}};
};
template <> struct ChoiceNames<OnNonFinite> {
  static constexpr std::array<std::pair<OnNonFinite, std::string_view>, 2> names = {
      {{OnNonFinite::stop, "stop"}, {OnNonFinite::skip, "skip"}}};
};
template <> struct ChoiceNames<CommBackend> {
  static constexpr std::array<std::pair<CommBackend, std::string_view>, 2> names = {
      {{CommBackend::mpi, "mpi"}, {CommBackend::nccl, "nccl"}}};
};
template <> struct ChoiceNames<SaveMode> {
  static constexpr std::array<std::pair<SaveMode, std::string_view>, 2> names = {
      {{SaveMode::async, "async"}, {SaveMode::sync, "sync"}}};
};
template <> struct ChoiceNames<DataType> {  // the training types
  static constexpr std::array<std::pair<DataType, std::string_view>, 3> names = {
      {{DataType::float32, "fp32"}, {DataType::bfloat16, "bf16"}, {DataType::float16, "fp16"}}};
};
template <> struct ChoiceNames<Fp8Recipe> {
  static constexpr std::array<std::pair<Fp8Recipe, std::string_view>, 3> names = {
      {{Fp8Recipe::none, "none"}, {Fp8Recipe::tensorwise, "tensorwise"}, {Fp8Recipe::rowwise, "rowwise"}}};
};
template <> struct ChoiceNames<Fp8Format> {
  static constexpr std::array<std::pair<Fp8Format, std::string_view>, 2> names = {
      {{Fp8Format::e4m3, "e4m3"}, {Fp8Format::e5m2, "e5m2"}}};
};
template <> struct ChoiceNames<Device> {
  static constexpr std::array<std::pair<Device, std::string_view>, 3> names = {
      {{Device::cpu, "cpu"}, {Device::cuda, "cuda"}, {Device::loopback, "loopback"}}};
};

template <typename Choice>
constexpr std::string_view choice_name(Choice choice) {
  for (const auto& [value, name] : ChoiceNames<Choice>::names)
    if (value == choice) return name;
  return "?";
}

template <typename Choice>
constexpr std::optional<Choice> parse_choice(std::string_view text) {
  for (const auto& [value, name] : ChoiceNames<Choice>::names)
    if (name == text) return value;
  return std::nullopt;
}

// "a | b | c": the choices, for messages and help.
template <typename Choice>
std::string choice_list() {
  std::string list;
  for (const auto& [value, name] : ChoiceNames<Choice>::names)
    list += (list.empty() ? "" : " | ") + std::string(name);
  return list;
}

// The model's shape (DESIGN.md §2.1).
struct ModelConfig {
  int layers = 4;
  int hidden = 256;
  int input_dim = 0;   // 0: the dataset's
  int output_dim = 0;  // 0: the dataset's
  int moe_every = 0;
  int experts = 8;
  int top_k = 2;
  double capacity_factor = 0;
  double aux_loss_coef = 0.01;
};

// The samples a step takes and how (§2.2).
struct DataConfig {
  DatasetKind kind = DatasetKind::teacher;
  std::string path;     // hdf5 only
  int memory_mb = 4096;  // an hdf5 file whose arrays fit is held in memory (0: never)
  int global_batch = 128;
  int micro_batches = 1;
  bool shuffle = false;
  int eval_every = 0;

  std::int64_t memory_bytes() const { return std::int64_t{memory_mb} << 20; }
};

// The optimizer, its schedule and what the loop does with a step (§2.1).
struct TrainingConfig {
  int steps = 100;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 0;
  OnNonFinite on_nan = OnNonFinite::stop;
  LearningRateSchedule lr_schedule = LearningRateSchedule::constant;
  int warmup_steps = 0;
  std::int64_t seed = 1234;
  bool recompute = false;  // activations dropped in forward, recomputed in backward
};

// The process grid's dimensions; the strategies that use them keep their own options.
struct GridConfig {
  int dp = 0;  // 0: world / (tp * pp)
  int tp = 1;
  int pp = 1;
  int ep = 1;
};

// The types of parameters, activations and gradient reductions, and fp16's loss scaling (§2.7).
struct PrecisionConfig {
  DataType param_dtype = DataType::float32;
  DataType reduce_dtype = DataType::float32;
  // These defaults mean "not given" (validation fills in fp16's).
  double loss_scale = -1;         // 0: dynamic, else a fixed scale
  double initial_loss_scale = 0;  // dynamic: the first scale (65536)
  int loss_scale_window = 0;      // dynamic: finite steps before the scale doubles (1000)
  double min_loss_scale = 0;      // dynamic: the scale never halves below this (1)
  Fp8Recipe fp8 = Fp8Recipe::none;
  Fp8Format fp8_grad_format = Fp8Format::e4m3;
  bool fp8_fast_accumulation = false;

  Precision types() const {
    return {.param = param_dtype, .reduce = reduce_dtype, .fp8 = fp8, .fp8_grad_format = fp8_grad_format,
            .fp8_fast_accumulation = fp8_fast_accumulation};
  }
};

// Where a rank computes and how its groups communicate.
struct DeviceConfig {
  Device kind = Device::cpu;
  bool tf32 = false;
  double peak_tflops = 0;  // a rank's peak for model FLOP utilization (0: known GPUs' table)
  CommBackend comm = CommBackend::mpi;
  bool offload = false;  // the optimizer's state and update in host memory
};

// What a run writes and when.
// --resume auto: the checkpoint directory's `latest` where there is one, else a fresh start.
inline constexpr std::string_view resume_auto = "auto";
inline constexpr int keep_all_checkpoints = std::numeric_limits<int>::max();

struct OutputConfig {
  int log_every = 10;
  std::string metrics_path;
  std::string trace_path;
  std::string checkpoint_dir;
  int save_every = 0;
  SaveMode save_mode = SaveMode::async;
  std::string resume;  // a file, a directory with `latest`, or resume_auto
  // Step files a checkpoint directory keeps, the newest (keep_all_checkpoints: every one).
  int keep_last = keep_all_checkpoints;
  bool predict = false;
  double timeout_s = 300;  // a step running longer is a hang: report and abort (0: never)
};

// Each strategy's own options, one typed block a strategy, declared in the strategy's files and
// registered with it (strategies/strategy_command_line.hpp): the run's configuration holds them without
// knowing their types. A block never set reads as its defaults.
class StrategyOptions {
 public:
  template <typename Block>
  const Block& get() const {
    const auto found = blocks_.find(std::type_index(typeid(Block)));
    if (found != blocks_.end()) return *std::any_cast<Block>(&found->second);
    static const Block defaults{};
    return defaults;
  }
  template <typename Block>
  Block& get() {
    return *std::any_cast<Block>(&blocks_.try_emplace(std::type_index(typeid(Block)), Block{}).first->second);
  }

 private:
  std::map<std::type_index, std::any> blocks_;
};

// The run's configuration (DESIGN.md §2.3), by section.
struct Config {
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  GridConfig grid;
  PrecisionConfig precision;
  DeviceConfig device;
  OutputConfig output;
  StrategyOptions strategies;
};

}  // namespace mlptrain
