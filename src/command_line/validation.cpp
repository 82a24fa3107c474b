// The options' rules (see parser.hpp): every value and combination checked for a world of ranks,
// section by section, the derived values filled in, each problem a UsageError naming the option.
// The strategies' own rules run from their registrations.
#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"
#include "command_line/parser.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

void validate_model(const ModelConfig& model) {
  at_least("layers", model.layers, 2);
  at_least("hidden", model.hidden, 1);
  at_least("input-dim", model.input_dim, 0);
  at_least("output-dim", model.output_dim, 0);
  // Widths beyond 2^24 cannot fit any memory; refusing them keeps every size product in range.
  constexpr int widest = 1 << 24;
  for (const auto& [name, value] : {std::pair{"hidden", model.hidden}, std::pair{"input-dim", model.input_dim},
                                    std::pair{"output-dim", model.output_dim}})
    require(value <= widest, fmt::format("--{} must be at most {} (got {})", name, widest, value));
  require(model.layers <= 100000, fmt::format("--layers must be at most 100000 (got {})", model.layers));
  at_least("moe-every", model.moe_every, 0);
  at_least("experts", model.experts, 1);
  at_least("top-k", model.top_k, 1);
  require(model.top_k <= model.experts, fmt::format("--top-k {} exceeds --experts {}", model.top_k, model.experts));
  at_least("capacity-factor", model.capacity_factor, 0.0);
  at_least("aux-loss-coef", model.aux_loss_coef, 0.0);
  if (model.moe_every > 0)
    require(model.moe_every <= model.layers - 2,
            fmt::format("--moe-every {} makes no layer MoE: only hidden layers 1..{} can be (--layers {})",
                        model.moe_every, model.layers - 2, model.layers));
}

void validate_data(const DataConfig& data) {
  at_least("data-memory-mb", data.memory_mb, 0);
  require(data.kind != DatasetKind::hdf5 || !data.path.empty(), "--dataset hdf5 needs --data-path FILE");
  require(data.kind == DatasetKind::hdf5 || data.path.empty(),
          fmt::format("--data-path is read only with --dataset hdf5 (got --dataset {})", choice_name(data.kind)));
  at_least("global-batch", data.global_batch, 1);
  at_least("micro-batches", data.micro_batches, 1);
  at_least("eval-every", data.eval_every, 0);
}

void validate_training(const TrainingConfig& training) {
  at_least("steps", training.steps, 0);
  at_least("lr", training.lr, 0.0);
  at_least("weight-decay", training.weight_decay, 0.0);
  require(training.beta1 >= 0 && training.beta1 < 1, fmt::format("--beta1 must be in [0, 1) (got {})", training.beta1));
  require(training.beta2 >= 0 && training.beta2 < 1, fmt::format("--beta2 must be in [0, 1) (got {})", training.beta2));
  require(training.eps > 0, fmt::format("--eps must be positive (got {})", training.eps));
  at_least("grad-clip", training.grad_clip, 0.0);
  at_least("warmup-steps", training.warmup_steps, 0);
  at_least("seed", training.seed, std::int64_t{0});
}

// One 16-bit format per run, and loss scaling only where fp16 is used (with its defaults filled).
void validate_precision(PrecisionConfig& precision) {
  const Precision types = precision.types();
  const bool half_param = is_half(precision.param_dtype), half_reduce = is_half(precision.reduce_dtype);
  require(!(half_param && half_reduce && precision.param_dtype != precision.reduce_dtype),
          fmt::format("--reduce-dtype {} with --param-dtype {}: a run uses one 16-bit format",
                      choice_name(precision.reduce_dtype), choice_name(precision.param_dtype)));
  const bool scale_given = precision.loss_scale >= 0 || precision.initial_loss_scale > 0 ||
                           precision.loss_scale_window > 0 || precision.min_loss_scale > 0;
  require(types.scales_loss() || !scale_given,
          "--loss-scale, --initial-loss-scale, --loss-scale-window and --min-loss-scale scale fp16 gradients: "
          "they need --param-dtype fp16 or --reduce-dtype fp16");
  require(precision.loss_scale < 0 || precision.loss_scale == 0 || precision.loss_scale >= 1,
          fmt::format("--loss-scale must be 0 (dynamic) or at least 1 (got {})", precision.loss_scale));
  at_least("initial-loss-scale", precision.initial_loss_scale, 0.0);
  at_least("loss-scale-window", precision.loss_scale_window, 0);
  at_least("min-loss-scale", precision.min_loss_scale, 0.0);
  if (!types.scales_loss()) return;
  // fp16's defaults, as PyTorch's GradScaler and Megatron-LM's dynamic scaler have them.
  if (precision.loss_scale < 0) precision.loss_scale = 0;
  if (precision.initial_loss_scale == 0) precision.initial_loss_scale = 65536;
  if (precision.loss_scale_window == 0) precision.loss_scale_window = 1000;
  if (precision.min_loss_scale == 0) precision.min_loss_scale = 1;
  require(precision.min_loss_scale <= precision.initial_loss_scale,
          fmt::format("--min-loss-scale {} exceeds --initial-loss-scale {}", precision.min_loss_scale,
                      precision.initial_loss_scale));
}

// fp8 products (§2.7): dense Linear layers (an MoE layer's experts and router compute in bf16),
// on the CPU's emulation or a GPU's fp8 GEMMs.
void validate_fp8(const Config& config) {
  if (!config.precision.types().fp8_gemms()) {
    require(config.precision.fp8_grad_format == Fp8Format::e4m3, "--fp8-grad-format needs --fp8 tensorwise or rowwise");
    require(!config.precision.fp8_fast_accumulation, "--fp8-fast-accumulation needs --fp8 tensorwise or rowwise");
    return;
  }
  const std::string recipe = fmt::format("--fp8 {}", choice_name(config.precision.fp8));
  require(config.precision.param_dtype == DataType::bfloat16,
          fmt::format("{} needs --param-dtype bf16 (the activations between fp8 products are bf16)", recipe));
  require(!config.precision.fp8_fast_accumulation || config.device.kind == Device::cuda,
          "--fp8-fast-accumulation is the tensor cores' accumulator: it needs --device cuda (the CPU's fp8 GEMM "
          "sums in fp32)");
}

void validate_device(const DeviceConfig& device) {
  at_least("peak-tflops", device.peak_tflops, 0.0);
  require(!device.offload || device.kind != Device::cpu,
          "--offload moves the optimizer state from GPU memory to host memory: it needs --device cuda "
          "(or loopback; with --device cpu the state is in host memory already)");
  require(!device.tf32 || device.kind == Device::cuda, "--tf32 lets cuBLAS use TF32 tensor cores: it needs --device cuda");
  require(device.comm != CommBackend::nccl || device.kind == Device::cuda,
          "--comm nccl moves GPU memory between GPUs directly: it needs --device cuda");
}

void validate_output(const OutputConfig& output) {
  at_least("log-every", output.log_every, 0);
  at_least("save-every", output.save_every, 0);
  at_least("timeout", output.timeout_s, 0.0);
  require(output.save_every == 0 || !output.checkpoint_dir.empty(), "--save-every needs --checkpoint-dir");
  at_least("keep-last", output.keep_last, 1);
  require(output.keep_last == keep_all_checkpoints || !output.checkpoint_dir.empty(),
          "--keep-last needs --checkpoint-dir (the folder whose step files it retires)");
  require(output.resume != resume_auto || !output.checkpoint_dir.empty(),
          "--resume auto needs --checkpoint-dir (the folder whose 'latest' it continues from)");
}

// The grid's dimensions on `world_size` ranks (dp derived when not given), and the batch's split
// over the micro-batches and the data-parallel ranks.
void validate_grid(GridConfig& grid, const DataConfig& data, int world_size) {
  at_least("dp", grid.dp, 0);
  at_least("tp", grid.tp, 1);
  at_least("pp", grid.pp, 1);
  at_least("ep", grid.ep, 1);
  const int model_parallel = grid.tp * grid.pp;
  if (grid.dp == 0) {
    require(world_size % model_parallel == 0,
            fmt::format("world size {} is not divisible by tp x pp = {} x {}", world_size, grid.tp, grid.pp));
    grid.dp = world_size / model_parallel;
  }
  require(grid.dp * model_parallel == world_size,
          fmt::format("dp x tp x pp = {} x {} x {} = {} does not match the world size {} (mpiexec -n)", grid.dp, grid.tp,
                      grid.pp, grid.dp * model_parallel, world_size));
  require(data.global_batch % data.micro_batches == 0,
          fmt::format("--global-batch {} is not divisible by --micro-batches {}", data.global_batch, data.micro_batches));
  require((data.global_batch / data.micro_batches) % grid.dp == 0,
          fmt::format("the micro-batch of {} samples (--global-batch {} / --micro-batches {}) is not divisible by dp {}",
                      data.global_batch / data.micro_batches, data.global_batch, data.micro_batches, grid.dp));
}

}  // namespace

void validate_options(Config& config, int world_size) {
  validate_model(config.model);
  validate_data(config.data);
  validate_training(config.training);
  for (double value : {config.training.lr, config.training.weight_decay, config.training.beta1, config.training.beta2,
                       config.training.eps, config.training.grad_clip, config.model.capacity_factor,
                       config.model.aux_loss_coef, config.output.timeout_s, config.device.peak_tflops,
                       config.precision.loss_scale, config.precision.initial_loss_scale, config.precision.min_loss_scale})
    require(std::isfinite(value), "option values must be finite numbers");
  validate_output(config.output);
  validate_grid(config.grid, config.data, world_size);
  for (const StrategyRegistration& strategy : strategy_registry())
    if (strategy.validate != nullptr) strategy.validate(config);
  validate_device(config.device);
  validate_precision(config.precision);
  validate_fp8(config);
}

}  // namespace mlptrain
