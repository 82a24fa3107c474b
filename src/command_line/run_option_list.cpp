// The run's own options (see parser.hpp): name, --help section, field and help of each, in
// --help order within each section. The strategies declare theirs in their registrations.
#include "command_line/parser.hpp"

#include "core/option_declaration.hpp"

namespace mlptrain {

namespace {

using S = OptionSection;

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

constexpr Option options[] = {
    {"layers", S::model, model<&ModelConfig::layers>, "Linear layers (>= 2)"},
    {"hidden", S::model, model<&ModelConfig::hidden>, "width of the hidden layers"},
    {"input-dim", S::model, model<&ModelConfig::input_dim>, "input features", "0: the dataset's"},
    {"output-dim", S::model, model<&ModelConfig::output_dim>, "outputs or classes", "0: the dataset's"},
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
    {"dp", S::parallelism, grid<&GridConfig::dp>, "data-parallel ranks", "derived: world / (tp pp)"},
    {"tp", S::parallelism, grid<&GridConfig::tp>, "tensor-parallel ranks"},
    {"pp", S::parallelism, grid<&GridConfig::pp>, "pipeline stages"},
    {"ep", S::parallelism, grid<&GridConfig::ep>, "expert-parallel ranks (divides dp)"},
    {"param-dtype", S::precision, precision<&PrecisionConfig::param_dtype>,
     "the parameters' compute copy and the activations (fp32 master weights with a 16-bit type)"},
    {"reduce-dtype", S::precision, precision<&PrecisionConfig::reduce_dtype>, "the gradients and their reductions"},
    {"loss-scale", S::precision, precision<&PrecisionConfig::loss_scale>, "fp16: 0 scales dynamically, S > 0 by a fixed S",
     "0 for fp16"},
    {"initial-loss-scale", S::precision, precision<&PrecisionConfig::initial_loss_scale>,
     "fp16, dynamic: the first loss scale", "65536 for fp16"},
    {"loss-scale-window", S::precision, precision<&PrecisionConfig::loss_scale_window>,
     "fp16, dynamic: steps without overflow before the scale doubles", "1000 for fp16"},
    {"min-loss-scale", S::precision, precision<&PrecisionConfig::min_loss_scale>, "fp16, dynamic: the smallest loss scale",
     "1 for fp16"},
    {"fp8", S::precision, precision<&PrecisionConfig::fp8>,
     "with --param-dtype bf16: Linear layers' GEMMs take fp8 operands, scaled per operand or per row"},
    {"fp8-grad-format", S::precision, precision<&PrecisionConfig::fp8_grad_format>,
     "with --fp8: the format of the gradients' operands (e5m2: more range, one mantissa bit less)"},
    {"fp8-fast-accumulation", S::precision, precision<&PrecisionConfig::fp8_fast_accumulation>,
     "with --fp8 on cuda: the tensor cores keep partial sums in their narrower accumulator"},
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
    {"resume", S::output, output<&OutputConfig::resume>,
     "checkpoint file, directory with 'latest', or auto (--checkpoint-dir's 'latest' if it has one, else a fresh "
     "start: a requeued job's unchanged command continues)"},
    {"keep-last", S::output, output<&OutputConfig::keep_last>,
     "step files --checkpoint-dir keeps, the newest (older ones are removed once a save is published)",
     "every one"},
    {"predict", S::output, output<&OutputConfig::predict>, "print predicted memory and communication, no training"},
    {"timeout", S::output, output<&OutputConfig::timeout_s>,
     "seconds a step may take before the job is reported hung and aborted (0: never)"},
};

}  // namespace

std::span<const Option> run_options() { return options; }

}  // namespace mlptrain
