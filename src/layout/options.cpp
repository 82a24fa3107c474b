// Option parsing and validation (see options.hpp).
#include "layout/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <variant>

#include "core/error.hpp"
#include "strategies/strategy.hpp"

namespace mlptrain {

namespace po = boost::program_options;

namespace {

enum class Section { model, data, training, parallelism, precision, devices, output };

// Calls visit(section, name, field, help) for every option of Config, in --help order.
template <typename Config_, typename Visit>
void visit_options(Config_& c, Visit&& visit) {
  using S = Section;
  visit(S::model, "layers", c.layers, "Linear layers (>= 2)");
  visit(S::model, "hidden", c.hidden, "width of the hidden layers");
  visit(S::model, "input-dim", c.input_dim, "input features (0: the dataset's)");
  visit(S::model, "output-dim", c.output_dim, "outputs or classes (0: the dataset's)");
  visit(S::model, "moe-every", c.moe_every, "every K-th hidden layer is MoE (0: none)");
  visit(S::model, "experts", c.experts, "experts per MoE layer");
  visit(S::model, "top-k", c.top_k, "experts chosen per token");
  visit(S::model, "capacity-factor", c.capacity_factor, "expert capacity factor (0: dropless)");
  visit(S::model, "aux-loss-coef", c.aux_loss_coef, "load-balancing loss coefficient");
  visit(S::data, "dataset", c.dataset, "teacher | mixture | hdf5");
  visit(S::data, "data-path", c.data_path, "HDF5 file for --dataset hdf5");
  visit(S::data, "data-memory-mb", c.data_memory_mb,
        "MiB of memory a rank may hold an hdf5 file's arrays in; a larger file is read a batch at a time (0: always)");
  visit(S::data, "global-batch", c.global_batch, "samples per optimizer step, all ranks");
  visit(S::data, "micro-batches", c.micro_batches, "micro-batches per step");
  visit(S::data, "shuffle", c.shuffle, "seeded permutation of the samples per epoch");
  visit(S::data, "eval-every", c.eval_every, "held-out evaluation every N steps (0: never)");
  visit(S::training, "steps", c.steps, "total optimizer steps of the run");
  visit(S::training, "lr", c.lr, "peak learning rate");
  visit(S::training, "weight-decay", c.weight_decay, "AdamW weight decay");
  visit(S::training, "beta1", c.beta1, "AdamW beta1");
  visit(S::training, "beta2", c.beta2, "AdamW beta2");
  visit(S::training, "eps", c.eps, "AdamW epsilon");
  visit(S::training, "grad-clip", c.grad_clip, "clip the global gradient L2 norm (0: off)");
  visit(S::training, "on-nan", c.on_nan, "non-finite loss or gradients: stop | skip (the step's update)");
  visit(S::training, "lr-schedule", c.lr_schedule, "constant | cosine");
  visit(S::training, "warmup-steps", c.warmup_steps, "linear warm-up steps");
  visit(S::training, "seed", c.seed, "seed of initialization and shuffling");
  visit(S::parallelism, "dp", c.dp, "data-parallel ranks (0: world / (tp * pp))");
  visit(S::parallelism, "tp", c.tp, "tensor-parallel ranks");
  visit(S::parallelism, "pp", c.pp, "pipeline stages");
  visit(S::parallelism, "ep", c.ep, "expert-parallel ranks (divides dp)");
  // The strategies' own options (each registration declares them).
  for (const StrategyRegistration& strategy : strategy_registry())
    for (const StrategyOption& option : strategy.options) {
      const std::string help =
          option.choices != nullptr ? std::string(option.help) + ": " + option.choices() : std::string(option.help);
      std::visit([&](auto member) { visit(S::parallelism, option.name.data(), c.*member, help); }, option.field);
    }
  visit(S::parallelism, "recompute", c.recompute, "recompute activations in backward");
  visit(S::parallelism, "offload", c.offload, "optimizer state and its update in host memory (cuda, loopback)");
  visit(S::precision, "param-dtype", c.param_dtype,
        "fp32 | bf16 | fp16: the parameters' compute copy and the activations (fp32 master weights "
        "with a 16-bit type)");
  visit(S::precision, "reduce-dtype", c.reduce_dtype, "fp32 | bf16 | fp16: the gradients and their reductions");
  visit(S::precision, "loss-scale", c.loss_scale, "fp16: 0 dynamic (the default), or a fixed loss scale");
  visit(S::precision, "initial-loss-scale", c.initial_loss_scale, "fp16, dynamic: the first loss scale (65536)");
  visit(S::precision, "loss-scale-window", c.loss_scale_window,
        "fp16, dynamic: steps without overflow before the scale doubles (1000)");
  visit(S::precision, "min-loss-scale", c.min_loss_scale, "fp16, dynamic: the smallest loss scale (1)");
  visit(S::devices, "device", c.device,
        "cpu | cuda | loopback (the CPU through the device path: checks it without a GPU)");
  visit(S::devices, "tf32", c.tf32, "let cuBLAS use TF32 tensor cores (cuda; fp32 otherwise)");
  visit(S::devices, "peak-tflops", c.peak_tflops,
        "a rank's peak TFLOP/s, for the model FLOP utilization (0: from the table of known GPUs)");
  visit(S::devices, "comm", c.comm, "mpi | nccl");
  visit(S::output, "log-every", c.log_every, "log a line every N steps (0: never)");
  visit(S::output, "metrics", c.metrics_path, "JSON Lines metrics file (rank 0)");
  visit(S::output, "trace", c.trace_path, "Chrome trace file");
  visit(S::output, "checkpoint-dir", c.checkpoint_dir, "directory for checkpoints");
  visit(S::output, "save-every", c.save_every, "checkpoint every N steps (0: only at the end)");
  visit(S::output, "save-mode", c.save_mode,
        "async (a checkpoint is copied to host memory, then written while training goes on) | sync");
  visit(S::output, "resume", c.resume, "checkpoint file, or directory with 'latest'");
  visit(S::output, "predict", c.predict, "print predicted memory and communication, no training");
  visit(S::output, "timeout", c.timeout_s, "seconds a step may take before the job is reported hung "
                                           "and aborted (0: never)");
}

const char* section_title(Section section) {
  switch (section) {
    case Section::model: return "Model";
    case Section::data: return "Data";
    case Section::training: return "Training";
    case Section::parallelism: return "Parallelism";
    case Section::precision: return "Precision";
    case Section::devices: return "Devices";
    case Section::output: return "Output";
  }
  return "";
}

template <typename T>
std::string ini_value(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return std::string(choice_name(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return fmt::format("{}", value);  // shortest text that reads back exactly
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else {
    return std::to_string(value);
  }
}

struct Descriptions {
  std::vector<po::options_description> sections;
  po::options_description all{"Options"};
  po::options_description in_files;  // what an INI file may set: not --help or --config

  explicit Descriptions(Config& config) {
    po::options_description general("General");
    general.add_options()("help,h", "show this help")("config", po::value<std::string>(),
                                                      "INI file of options (command line wins)");
    all.add(general);
    for (int index = 0; index <= static_cast<int>(Section::output); ++index)
      sections.emplace_back(section_title(static_cast<Section>(index)));
    visit_options(config, [&](Section section, const char* name, auto& field, const std::string& help_text) {
      const char* help = help_text.c_str();
      using T = std::remove_reference_t<decltype(field)>;
      auto& description = sections[static_cast<int>(section)];
      if constexpr (std::is_enum_v<T>) {
        // A closed set is read as its name and checked at once, naming the choices.
        description.add_options()(
            name,
            po::value<std::string>()->default_value(ini_value(field))->notifier([&field, name](const std::string& text) {
              const std::optional<T> choice = parse_choice<T>(text);
              if (!choice)
                throw UsageError(fmt::format("--{}: unknown value '{}' (choose {})", name, text, choice_list<T>()));
              field = *choice;
            }),
            help);
      } else if constexpr (std::is_same_v<T, bool>) {
        // `--flag` alone means true; `--flag=false` switches off what an INI file switched on.
        description.add_options()(
            name, po::value<bool>(&field)->default_value(field)->implicit_value(true), help);
      } else {
        description.add_options()(name, po::value<T>(&field)->default_value(field, ini_value(field)),
                                  help);
      }
    });
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
  const Precision precision = c.precision();
  const bool half_param = is_half(c.param_dtype), half_reduce = is_half(c.reduce_dtype);
  require(!(half_param && half_reduce && c.param_dtype != c.reduce_dtype),
          fmt::format("--reduce-dtype {} with --param-dtype {}: a run uses one 16-bit format", choice_name(c.reduce_dtype),
                      choice_name(c.param_dtype)));
  const bool scale_given = c.loss_scale >= 0 || c.initial_loss_scale > 0 || c.loss_scale_window > 0 || c.min_loss_scale > 0;
  require(precision.scales_loss() || !scale_given,
          "--loss-scale, --initial-loss-scale, --loss-scale-window and --min-loss-scale scale fp16 gradients: "
          "they need --param-dtype fp16 or --reduce-dtype fp16");
  require(c.loss_scale < 0 || c.loss_scale == 0 || c.loss_scale >= 1,
          fmt::format("--loss-scale must be 0 (dynamic) or at least 1 (got {})", c.loss_scale));
  at_least("initial-loss-scale", c.initial_loss_scale, 0.0);
  at_least("loss-scale-window", c.loss_scale_window, 0);
  at_least("min-loss-scale", c.min_loss_scale, 0.0);
  if (!precision.scales_loss()) return;
  // fp16's defaults, as PyTorch's GradScaler and Megatron-LM's dynamic scaler have them.
  if (c.loss_scale < 0) c.loss_scale = 0;
  if (c.initial_loss_scale == 0) c.initial_loss_scale = 65536;
  if (c.loss_scale_window == 0) c.loss_scale_window = 1000;
  if (c.min_loss_scale == 0) c.min_loss_scale = 1;
  require(c.min_loss_scale <= c.initial_loss_scale,
          fmt::format("--min-loss-scale {} exceeds --initial-loss-scale {}", c.min_loss_scale, c.initial_loss_scale));
}

}  // namespace

void validate_options(Config& c, int world_size) {
  at_least("layers", c.layers, 2);
  at_least("data-memory-mb", c.data_memory_mb, 0);
  at_least("hidden", c.hidden, 1);
  at_least("input-dim", c.input_dim, 0);
  at_least("output-dim", c.output_dim, 0);
  // Widths beyond 2^24 cannot fit any memory; refusing them keeps every size product in range.
  constexpr int widest = 1 << 24;
  for (const auto& [name, value] : {std::pair{"hidden", c.hidden}, std::pair{"input-dim", c.input_dim},
                                    std::pair{"output-dim", c.output_dim}})
    require(value <= widest, fmt::format("--{} must be at most {} (got {})", name, widest, value));
  require(c.layers <= 100000, fmt::format("--layers must be at most 100000 (got {})", c.layers));
  at_least("moe-every", c.moe_every, 0);
  at_least("experts", c.experts, 1);
  at_least("top-k", c.top_k, 1);
  require(c.top_k <= c.experts,
          fmt::format("--top-k {} exceeds --experts {}", c.top_k, c.experts));
  at_least("capacity-factor", c.capacity_factor, 0.0);
  at_least("aux-loss-coef", c.aux_loss_coef, 0.0);
  require(c.dataset != DatasetKind::hdf5 || !c.data_path.empty(), "--dataset hdf5 needs --data-path FILE");
  require(c.dataset == DatasetKind::hdf5 || c.data_path.empty(),
          fmt::format("--data-path is read only with --dataset hdf5 (got --dataset {})", choice_name(c.dataset)));
  at_least("global-batch", c.global_batch, 1);
  at_least("micro-batches", c.micro_batches, 1);
  at_least("eval-every", c.eval_every, 0);
  at_least("steps", c.steps, 0);
  at_least("lr", c.lr, 0.0);
  at_least("weight-decay", c.weight_decay, 0.0);
  require(c.beta1 >= 0 && c.beta1 < 1, fmt::format("--beta1 must be in [0, 1) (got {})", c.beta1));
  require(c.beta2 >= 0 && c.beta2 < 1, fmt::format("--beta2 must be in [0, 1) (got {})", c.beta2));
  require(c.eps > 0, fmt::format("--eps must be positive (got {})", c.eps));
  at_least("grad-clip", c.grad_clip, 0.0);
  at_least("warmup-steps", c.warmup_steps, 0);
  at_least("seed", c.seed, std::int64_t{0});
  for (double value : {c.lr, c.weight_decay, c.beta1, c.beta2, c.eps, c.grad_clip,
                       c.capacity_factor, c.aux_loss_coef, c.timeout_s, c.peak_tflops, c.loss_scale,
                       c.initial_loss_scale, c.min_loss_scale})
    require(std::isfinite(value), "option values must be finite numbers");

  at_least("dp", c.dp, 0);
  at_least("tp", c.tp, 1);
  at_least("pp", c.pp, 1);
  at_least("ep", c.ep, 1);
  at_least("log-every", c.log_every, 0);
  at_least("save-every", c.save_every, 0);
  at_least("timeout", c.timeout_s, 0.0);
  at_least("peak-tflops", c.peak_tflops, 0.0);

  const int model_parallel = c.tp * c.pp;
  if (c.dp == 0) {
    require(world_size % model_parallel == 0,
            fmt::format("world size {} is not divisible by tp x pp = {} x {}", world_size, c.tp, c.pp));
    c.dp = world_size / model_parallel;
  }
  require(c.dp * model_parallel == world_size,
          fmt::format("dp x tp x pp = {} x {} x {} = {} does not match the world size {} "
                      "(mpiexec -n)", c.dp, c.tp, c.pp, c.dp * model_parallel, world_size));
  require(c.global_batch % c.micro_batches == 0,
          fmt::format("--global-batch {} is not divisible by --micro-batches {}", c.global_batch,
                      c.micro_batches));
  require((c.global_batch / c.micro_batches) % c.dp == 0,
          fmt::format("the micro-batch of {} samples (--global-batch {} / --micro-batches {}) is "
                      "not divisible by dp {}", c.global_batch / c.micro_batches, c.global_batch,
                      c.micro_batches, c.dp));
  require(c.save_every == 0 || !c.checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  for (const StrategyRegistration& strategy : strategy_registry())
    if (strategy.validate != nullptr) strategy.validate(c);

  if (c.moe_every > 0) {
    require(c.moe_every <= c.layers - 2,
            fmt::format("--moe-every {} makes no layer MoE: only hidden layers 1..{} can be (--layers {})",
                        c.moe_every, c.layers - 2, c.layers));
  }
  require(!c.offload || c.device != Device::cpu,
          "--offload moves the optimizer state from GPU memory to host memory: it needs --device cuda "
          "(or loopback; with --device cpu the state is in host memory already)");
  require(!c.tf32 || c.device == Device::cuda, "--tf32 lets cuBLAS use TF32 tensor cores: it needs --device cuda");
  validate_precision(c);
  require(c.comm != CommBackend::nccl || c.device == Device::cuda,
          "--comm nccl moves GPU memory between GPUs directly: it needs --device cuda");
}

GridShape grid_shape(const Config& config, int world_size) {
  return {.world = world_size,
          .tp = config.tp,
          .dp = config.dp,
          .pp = config.pp,
          .ep = config.ep,
          .zero_shard = config.zero_shard_size};
}

std::string to_ini(const Config& config) {
  std::string text = "# mlptrain configuration\n";
  visit_options(config, [&](Section, const char* name, const auto& field, const std::string&) {
    text += fmt::format("{} = {}\n", name, ini_value(field));
  });
  return text;
}

std::vector<std::string> model_shape_options() {
  return {"layers", "hidden", "input-dim", "output-dim", "moe-every", "experts"};
}

}  // namespace mlptrain
