// Option parsing and validation (see options.hpp).
#include "layout/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <variant>

#include "core/error.hpp"
#include "core/option.hpp"
#include "strategies/strategy.hpp"
#include "strategies/zero/zero_options.hpp"

namespace mlptrain {

namespace po = boost::program_options;

namespace {

using S = OptionSection;

// The run's own options, in --help order within each section (the strategies declare theirs).
template <auto member>
constexpr auto model = config_field<&Config::model, member>;
template <auto member>
constexpr auto data = config_field<&Config::data, member>;
template <auto member>
constexpr auto training = config_field<&Config::training, member>;
template <auto member>
constexpr auto grid = config_field<&Config::grid, member>;
template <auto member>
constexpr auto precision = config_field<&Config::precision, member>;
template <auto member>
constexpr auto device = config_field<&Config::device, member>;
template <auto member>
constexpr auto output = config_field<&Config::output, member>;

constexpr Option run_options[] = {
    {"layers", S::model, model<&ModelConfig::layers>, "Linear layers (>= 2)"},
    {"hidden", S::model, model<&ModelConfig::hidden>, "width of the hidden layers"},
    {"input-dim", S::model, model<&ModelConfig::input_dim>, "input features (0: the dataset's)"},
    {"output-dim", S::model, model<&ModelConfig::output_dim>, "outputs or classes (0: the dataset's)"},
    {"moe-every", S::model, model<&ModelConfig::moe_every>, "every K-th hidden layer is MoE (0: none)"},
    {"experts", S::model, model<&ModelConfig::experts>, "experts per MoE layer"},
    {"top-k", S::model, model<&ModelConfig::top_k>, "experts chosen per token"},
    {"capacity-factor", S::model, model<&ModelConfig::capacity_factor>, "expert capacity factor (0: dropless)"},
    {"aux-loss-coef", S::model, model<&ModelConfig::aux_loss_coef>, "load-balancing loss coefficient"},
    {"dataset", S::data, data<&DataConfig::kind>, "the samples"},
    {"data-path", S::data, data<&DataConfig::path>, "HDF5 file for --dataset hdf5"},
    {"data-memory-mb", S::data, data<&DataConfig::memory_mb>,
     "MiB of memory a rank may hold an hdf5 file's arrays in; a larger file is read a batch at a time (0: always)"},
    {"global-batch", S::data, data<&DataConfig::global_batch>, "samples per optimizer step, all ranks"},
    {"micro-batches", S::data, data<&DataConfig::micro_batches>, "micro-batches per step"},
    {"shuffle", S::data, data<&DataConfig::shuffle>, "seeded permutation of the samples per epoch"},
    {"eval-every", S::data, data<&DataConfig::eval_every>, "held-out evaluation every N steps (0: never)"},
    {"steps", S::training, training<&TrainingConfig::steps>, "total optimizer steps of the run"},
    {"lr", S::training, training<&TrainingConfig::lr>, "peak learning rate"},
    {"weight-decay", S::training, training<&TrainingConfig::weight_decay>, "AdamW weight decay"},
    {"beta1", S::training, training<&TrainingConfig::beta1>, "AdamW beta1"},
    {"beta2", S::training, training<&TrainingConfig::beta2>, "AdamW beta2"},
    {"eps", S::training, training<&TrainingConfig::eps>, "AdamW epsilon"},
    {"grad-clip", S::training, training<&TrainingConfig::grad_clip>, "clip the global gradient L2 norm (0: off)"},
    {"on-nan", S::training, training<&TrainingConfig::on_nan>, "a non-finite loss or gradient stops the run, or skips the step's update"},
    {"lr-schedule", S::training, training<&TrainingConfig::lr_schedule>, "learning rate over the steps"},
    {"warmup-steps", S::training, training<&TrainingConfig::warmup_steps>, "linear warm-up steps"},
    {"seed", S::training, training<&TrainingConfig::seed>, "seed of initialization and shuffling"},
    {"recompute", S::training, training<&TrainingConfig::recompute>, "recompute activations in backward"},
    {"dp", S::parallelism, grid<&GridConfig::dp>, "data-parallel ranks (0: world / (tp * pp))"},
    {"tp", S::parallelism, grid<&GridConfig::tp>, "tensor-parallel ranks"},
    {"pp", S::parallelism, grid<&GridConfig::pp>, "pipeline stages"},
    {"ep", S::parallelism, grid<&GridConfig::ep>, "expert-parallel ranks (divides dp)"},
    {"param-dtype", S::precision, precision<&PrecisionConfig::param_dtype>,
     "the parameters' compute copy and the activations (fp32 master weights with a 16-bit type)"},
    {"reduce-dtype", S::precision, precision<&PrecisionConfig::reduce_dtype>, "the gradients and their reductions"},
    {"loss-scale", S::precision, precision<&PrecisionConfig::loss_scale>, "fp16: 0 dynamic (the default), or a fixed loss scale"},
    {"initial-loss-scale", S::precision, precision<&PrecisionConfig::initial_loss_scale>,
     "fp16, dynamic: the first loss scale (65536)"},
    {"loss-scale-window", S::precision, precision<&PrecisionConfig::loss_scale_window>,
     "fp16, dynamic: steps without overflow before the scale doubles (1000)"},
    {"min-loss-scale", S::precision, precision<&PrecisionConfig::min_loss_scale>, "fp16, dynamic: the smallest loss scale (1)"},
    {"device", S::devices, device<&DeviceConfig::kind>, "where a rank computes (loopback: the CPU through the device path)"},
    {"tf32", S::devices, device<&DeviceConfig::tf32>, "let cuBLAS use TF32 tensor cores (cuda; fp32 otherwise)"},
    {"peak-tflops", S::devices, device<&DeviceConfig::peak_tflops>,
     "a rank's peak TFLOP/s, for the model FLOP utilization (0: from the table of known GPUs)"},
    {"comm", S::devices, device<&DeviceConfig::comm>, "how groups communicate"},
    {"offload", S::devices, device<&DeviceConfig::offload>, "optimizer state and its update in host memory (cuda, loopback)"},
    {"log-every", S::output, output<&OutputConfig::log_every>, "log a line every N steps (0: never)"},
    {"metrics", S::output, output<&OutputConfig::metrics_path>, "JSON Lines metrics file (rank 0)"},
    {"trace", S::output, output<&OutputConfig::trace_path>, "Chrome trace file"},
    {"checkpoint-dir", S::output, output<&OutputConfig::checkpoint_dir>, "directory for checkpoints"},
    {"save-every", S::output, output<&OutputConfig::save_every>, "checkpoint every N steps (0: only at the end)"},
    {"save-mode", S::output, output<&OutputConfig::save_mode>,
     "async: a checkpoint is copied to host memory, then written while training goes on"},
    {"resume", S::output, output<&OutputConfig::resume>, "checkpoint file, or directory with 'latest'"},
    {"predict", S::output, output<&OutputConfig::predict>, "print predicted memory and communication, no training"},
    {"timeout", S::output, output<&OutputConfig::timeout_s>,
     "seconds a step may take before the job is reported hung and aborted (0: never)"},
};

// Every option: the run's, then each strategy's (in the parallelism section).
std::vector<Option> all_options() {
  std::vector<Option> options(std::begin(run_options), std::end(run_options));
  for (const StrategyRegistration& strategy : strategy_registry())
    options.insert(options.end(), strategy.options.begin(), strategy.options.end());
  return options;
}

const char* section_title(OptionSection section) {
  switch (section) {
    case S::model: return "Model";
    case S::data: return "Data";
    case S::training: return "Training";
    case S::parallelism: return "Parallelism";
    case S::precision: return "Precision";
    case S::devices: return "Devices";
    case S::output: return "Output";
  }
  return "";
}

// A value as INI files and --help write it.
std::string ini_value(const OptionField& field) {
  return std::visit(
      [](const auto& value) -> std::string {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ChoiceField>) {
          return std::string(value.name(value.field));
        } else if constexpr (std::is_same_v<T, bool*>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double*>) {
          return fmt::format("{}", *value);  // shortest text that reads back exactly
        } else if constexpr (std::is_same_v<T, std::string*>) {
          return *value;
        } else {
          return std::to_string(*value);
        }
      },
      field);
}

struct Descriptions {
  std::vector<po::options_description> sections;
  po::options_description all{"Options"};
  po::options_description in_files;  // what an INI file may set: not --help or --config
  std::vector<std::string> helps;     // kept alive: Boost keeps pointers to them

  explicit Descriptions(Config& config) {
    po::options_description general("General");
    general.add_options()("help,h", "show this help")("config", po::value<std::string>(),
                                                      "INI file of options (command line wins)");
    all.add(general);
    for (int index = 0; index <= static_cast<int>(S::output); ++index)
      sections.emplace_back(section_title(static_cast<S>(index)));
    const std::vector<Option> options = all_options();
    helps.reserve(options.size());
    for (const Option& option : options) {
      const OptionField field = option.field(config);
      const char* name = option.name.data();
      auto& description = sections[static_cast<int>(option.section)];
      std::visit(
          [&](auto value) {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, ChoiceField>) {
              // A closed set is read as its name and checked at once, naming the choices.
              const char* help = helps.emplace_back(fmt::format("{}: {}", option.help, value.list())).c_str();
              description.add_options()(
                  name,
                  po::value<std::string>()->default_value(ini_value(value))->notifier([value, name](const std::string& text) {
                    if (!value.assign(value.field, text))
                      throw UsageError(fmt::format("--{}: unknown value '{}' (choose {})", name, text, value.list()));
                  }),
                  help);
            } else if constexpr (std::is_same_v<T, bool*>) {
              // `--flag` alone means true; `--flag=false` switches off what an INI file switched on.
              description.add_options()(name, po::value<bool>(value)->default_value(*value)->implicit_value(true),
                                        option.help.data());
            } else {
              description.add_options()(name, po::value(value)->default_value(*value, ini_value(value)),
                                        option.help.data());
            }
          },
          field);
    }
    for (auto& section : sections) {
      all.add(section);
      in_files.add(section);
    }
  }
};

}  // namespace

ParsedOptions parse_options(const std::vector<std::string>& arguments) {
  ParsedOptions parsed;
  Descriptions descriptions(parsed.config);
  po::variables_map values;
  try {
    po::store(po::command_line_parser(arguments).options(descriptions.all).run(), values);
  } catch (const po::error& error) {
    throw UsageError(std::string(error.what()) + " (see --help)");
  }
  if (values.count("help")) {
    std::ostringstream text;
    text << "usage: mpiexec -n N mlptrain [options]\n\n" << descriptions.all;
    parsed.help = true;
    parsed.help_text = text.str();
    return parsed;
  }
  if (values.count("config")) {
    const std::string path = values["config"].as<std::string>();
    std::ifstream file(path);
    if (!file) throw UsageError("--config: cannot open '" + path + "'");
    try {
      po::store(po::parse_config_file(file, descriptions.in_files), values);
    } catch (const po::error& error) {
      throw UsageError("--config '" + path + "': " + error.what());
    }
  }
  try {
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(std::string(error.what()) + " (see --help)");
  }
  return parsed;
}

namespace {

// The precision options: one 16-bit format per run, and loss scaling only where fp16 is used.
void validate_precision(Config& c) {
  const Precision precision = c.precision.types();
  const bool half_param = is_half(c.precision.param_dtype), half_reduce = is_half(c.precision.reduce_dtype);
  require(!(half_param && half_reduce && c.precision.param_dtype != c.precision.reduce_dtype),
          fmt::format("--reduce-dtype {} with --param-dtype {}: a run uses one 16-bit format", choice_name(c.precision.reduce_dtype),
                      choice_name(c.precision.param_dtype)));
  const bool scale_given = c.precision.loss_scale >= 0 || c.precision.initial_loss_scale > 0 || c.precision.loss_scale_window > 0 || c.precision.min_loss_scale > 0;
  require(precision.scales_loss() || !scale_given,
          "--loss-scale, --initial-loss-scale, --loss-scale-window and --min-loss-scale scale fp16 gradients: "
          "they need --param-dtype fp16 or --reduce-dtype fp16");
  require(c.precision.loss_scale < 0 || c.precision.loss_scale == 0 || c.precision.loss_scale >= 1,
          fmt::format("--loss-scale must be 0 (dynamic) or at least 1 (got {})", c.precision.loss_scale));
  at_least("initial-loss-scale", c.precision.initial_loss_scale, 0.0);
  at_least("loss-scale-window", c.precision.loss_scale_window, 0);
  at_least("min-loss-scale", c.precision.min_loss_scale, 0.0);
  if (!precision.scales_loss()) return;
  // fp16's defaults, as PyTorch's GradScaler and Megatron-LM's dynamic scaler have them.
  if (c.precision.loss_scale < 0) c.precision.loss_scale = 0;
  if (c.precision.initial_loss_scale == 0) c.precision.initial_loss_scale = 65536;
  if (c.precision.loss_scale_window == 0) c.precision.loss_scale_window = 1000;
  if (c.precision.min_loss_scale == 0) c.precision.min_loss_scale = 1;
  require(c.precision.min_loss_scale <= c.precision.initial_loss_scale,
          fmt::format("--min-loss-scale {} exceeds --initial-loss-scale {}", c.precision.min_loss_scale, c.precision.initial_loss_scale));
}

}  // namespace

void validate_options(Config& c, int world_size) {
  at_least("layers", c.model.layers, 2);
  at_least("data-memory-mb", c.data.memory_mb, 0);
  at_least("hidden", c.model.hidden, 1);
  at_least("input-dim", c.model.input_dim, 0);
  at_least("output-dim", c.model.output_dim, 0);
  // Widths beyond 2^24 cannot fit any memory; refusing them keeps every size product in range.
  constexpr int widest = 1 << 24;
  for (const auto& [name, value] : {std::pair{"hidden", c.model.hidden}, std::pair{"input-dim", c.model.input_dim},
                                    std::pair{"output-dim", c.model.output_dim}})
    require(value <= widest, fmt::format("--{} must be at most {} (got {})", name, widest, value));
  require(c.model.layers <= 100000, fmt::format("--layers must be at most 100000 (got {})", c.model.layers));
  at_least("moe-every", c.model.moe_every, 0);
  at_least("experts", c.model.experts, 1);
  at_least("top-k", c.model.top_k, 1);
  require(c.model.top_k <= c.model.experts,
          fmt::format("--top-k {} exceeds --experts {}", c.model.top_k, c.model.experts));
  at_least("capacity-factor", c.model.capacity_factor, 0.0);
  at_least("aux-loss-coef", c.model.aux_loss_coef, 0.0);
  require(c.data.kind != DatasetKind::hdf5 || !c.data.path.empty(), "--dataset hdf5 needs --data-path FILE");
  require(c.data.kind == DatasetKind::hdf5 || c.data.path.empty(),
          fmt::format("--data-path is read only with --dataset hdf5 (got --dataset {})", choice_name(c.data.kind)));
  at_least("global-batch", c.data.global_batch, 1);
  at_least("micro-batches", c.data.micro_batches, 1);
  at_least("eval-every", c.data.eval_every, 0);
  at_least("steps", c.training.steps, 0);
  at_least("lr", c.training.lr, 0.0);
  at_least("weight-decay", c.training.weight_decay, 0.0);
  require(c.training.beta1 >= 0 && c.training.beta1 < 1, fmt::format("--beta1 must be in [0, 1) (got {})", c.training.beta1));
  require(c.training.beta2 >= 0 && c.training.beta2 < 1, fmt::format("--beta2 must be in [0, 1) (got {})", c.training.beta2));
  require(c.training.eps > 0, fmt::format("--eps must be positive (got {})", c.training.eps));
  at_least("grad-clip", c.training.grad_clip, 0.0);
  at_least("warmup-steps", c.training.warmup_steps, 0);
  at_least("seed", c.training.seed, std::int64_t{0});
  for (double value : {c.training.lr, c.training.weight_decay, c.training.beta1, c.training.beta2, c.training.eps, c.training.grad_clip,
                       c.model.capacity_factor, c.model.aux_loss_coef, c.output.timeout_s, c.device.peak_tflops, c.precision.loss_scale,
                       c.precision.initial_loss_scale, c.precision.min_loss_scale})
    require(std::isfinite(value), "option values must be finite numbers");

  at_least("dp", c.grid.dp, 0);
  at_least("tp", c.grid.tp, 1);
  at_least("pp", c.grid.pp, 1);
  at_least("ep", c.grid.ep, 1);
  at_least("log-every", c.output.log_every, 0);
  at_least("save-every", c.output.save_every, 0);
  at_least("timeout", c.output.timeout_s, 0.0);
  at_least("peak-tflops", c.device.peak_tflops, 0.0);

  const int model_parallel = c.grid.tp * c.grid.pp;
  if (c.grid.dp == 0) {
    require(world_size % model_parallel == 0,
            fmt::format("world size {} is not divisible by tp x pp = {} x {}", world_size, c.grid.tp, c.grid.pp));
    c.grid.dp = world_size / model_parallel;
  }
  require(c.grid.dp * model_parallel == world_size,
          fmt::format("dp x tp x pp = {} x {} x {} = {} does not match the world size {} "
                      "(mpiexec -n)", c.grid.dp, c.grid.tp, c.grid.pp, c.grid.dp * model_parallel, world_size));
  require(c.data.global_batch % c.data.micro_batches == 0,
          fmt::format("--global-batch {} is not divisible by --micro-batches {}", c.data.global_batch,
                      c.data.micro_batches));
  require((c.data.global_batch / c.data.micro_batches) % c.grid.dp == 0,
          fmt::format("the micro-batch of {} samples (--global-batch {} / --micro-batches {}) is "
                      "not divisible by dp {}", c.data.global_batch / c.data.micro_batches, c.data.global_batch,
                      c.data.micro_batches, c.grid.dp));
  require(c.output.save_every == 0 || !c.output.checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  for (const StrategyRegistration& strategy : strategy_registry())
    if (strategy.validate != nullptr) strategy.validate(c);

  if (c.model.moe_every > 0) {
    require(c.model.moe_every <= c.model.layers - 2,
            fmt::format("--moe-every {} makes no layer MoE: only hidden layers 1..{} can be (--layers {})",
                        c.model.moe_every, c.model.layers - 2, c.model.layers));
  }
  require(!c.device.offload || c.device.kind != Device::cpu,
          "--offload moves the optimizer state from GPU memory to host memory: it needs --device cuda "
          "(or loopback; with --device cpu the state is in host memory already)");
  require(!c.device.tf32 || c.device.kind == Device::cuda, "--tf32 lets cuBLAS use TF32 tensor cores: it needs --device cuda");
  validate_precision(c);
  require(c.device.comm != CommBackend::nccl || c.device.kind == Device::cuda,
          "--comm nccl moves GPU memory between GPUs directly: it needs --device cuda");
}

GridShape grid_shape(const Config& config, int world_size) {
  return {.world = world_size,
          .tp = config.grid.tp,
          .dp = config.grid.dp,
          .pp = config.grid.pp,
          .ep = config.grid.ep,
          .zero_shard = config.strategies.get<ZeroOptions>().shard_size};
}

std::string to_ini(const Config& config) {
  std::string text = "# mlptrain configuration\n";
  Config read = config;  // the fields are read through mutable views
  for (const Option& option : all_options())
    text += fmt::format("{} = {}\n", option.name, ini_value(option.field(read)));
  return text;
}

std::vector<OptionDescription> option_descriptions() {
  std::vector<OptionDescription> descriptions;
  Config defaults;
  for (const Option& option : all_options())
    descriptions.push_back({.name = std::string(option.name),
                            .section = section_title(option.section),
                            .default_value = ini_value(option.field(defaults)),
                            .help = std::string(option.help)});
  return descriptions;
}

std::vector<std::string> model_shape_options() {
  return {"layers", "hidden", "input-dim", "output-dim", "moe-every", "experts"};
}

}  // namespace mlptrain
