// The run's header, prediction, summary and trace (see run_description.hpp).
#include "train/run_description.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "comm/consensus.hpp"
#include "strategies/rank_plan.hpp"
#include "strategies/registration.hpp"
#include "report/trace_file.hpp"

namespace mlptrain {

namespace {

RankLayout layout_of(const Run& run) {
  return rank_layout(run.model->taking_part, run.config, run.model->specs, run.groups->shape(), run.groups->place(),
                     run.data->loss_kind());
}

// The precision line: what each state is held in, and how a half loss is scaled.
std::string describe_precision(const Config& config) {
  const Precision precision = config.precision.types();
  std::string text = fmt::format(
      "precision: params and activations {}, gradients and their reductions {}, optimizer {} ({} bytes a "
      "parameter)",
      data_type_name(precision.param), data_type_name(precision.reduce),
      precision.keeps_master() ? "fp32 master weights and moments" : "fp32 moments", precision.optimizer_bytes());
  if (precision.fp8_gemms())
    text += fmt::format("; dense layers' GEMMs from fp8 operands ({} scales, inputs and weights e4m3, gradients {})",
                        choice_name(precision.fp8), choice_name(precision.fp8_grad_format));
  if (!precision.scales_loss()) return text;
  if (config.precision.loss_scale > 0) return text + fmt::format("; loss scale {:g}", config.precision.loss_scale);
  return text + fmt::format("; dynamic loss scale from {:g} (halved on overflow, not below {:g}; doubled after {} "
                            "finite steps)",
                            config.precision.initial_loss_scale, config.precision.min_loss_scale, config.precision.loss_scale_window);
}

}  // namespace

std::string describe_run(const Run& run) {
  const Config& config = run.config;
  const GridShape& shape = run.groups->shape();
  const std::vector<LayerSpec>& specs = run.model->specs;
  std::string widths = std::to_string(specs.front().in_features);
  for (const LayerSpec& spec : specs) widths += "->" + std::to_string(spec.out_features);
  std::string strategies;
  for (std::string_view name : run.model->strategies->names()) strategies += " " + std::string(name);
  std::string text = fmt::format(
      "mlptrain: {} rank(s), {}{}, strategies:{}\n"
      "model: {} layers {} ({} parameters), {} data ({} train samples), global batch {} in {} "
      "micro-batch(es), {} steps\ndevice: {}, communication: {}\nkernels: {}",
      shape.world, layout_words(shape, run_settings(config, shape)),
      hybrid_sharding(shape) ? fmt::format(" (shards over {})", shard_ranks(shape)) : "",
      strategies.empty() ? " none" : strategies,
      specs.size(), widths, parameter_count(specs), run.data->info().name, run.data->info().train_size,
      config.data.global_batch, config.data.micro_batches, config.training.steps, run.device.description,
      config.device.comm == CommBackend::nccl ? "NCCL, device to device"
      : run.device.staging             ? "MPI, staged through host memory"
                                       : "MPI",
      run.device.kernels->description());
  text += "\n" + describe_precision(config);
  if (!run.model->moe_layers.empty()) {
    std::string layers;
    for (int layer : run.model->moe_layers) layers += (layers.empty() ? "" : ", ") + std::to_string(layer);
    text += fmt::format("\nMoE layer(s) {}: {} experts, top-{}, {}, aux loss coefficient {}", layers,
                        config.model.experts, config.model.top_k,
                        config.model.capacity_factor > 0 ? fmt::format("capacity factor {}", config.model.capacity_factor)
                                                   : std::string("dropless"),
                        config.model.aux_loss_coef);
  }
  if (config.training.recompute)
    text += fmt::format("\nrecompute: the local layers form segments of {}; forward keeps each segment's input "
                        "and backward recomputes the rest",
                        run.model->runners.front()->recompute_plan().segment_length());
  if (run.device.offload)
    text += fmt::format("\noffload: AdamW's moments and update in host memory, {} piece(s) a step, {}",
                        run.model->optimizer->offloaded_pieces(),
                        run.model->values_read_after_step
                            ? "done within the step (the sharded state is gathered right after it)"
                            : "each sent back while the next forward runs");
  for (const std::string& note : strategy_notes(run.model->taking_part, layout_of(run))) text += "\n" + note;
  return text;
}

Prediction predict_this_rank(const Run& run) {
  return predict_rank(run.model->taking_part, layout_of(run),
                      {.largest_moe_activation_bytes = run.model->largest_moe_bytes()});
}

void complete_summary(Run& run, const MemoryByState& run_peak, RunSummary& summary) {
  summary.peak_memory = run_peak;
  summary.peak_host_memory = run.ledgers.host_memory.peak();
  summary.prediction = predict_this_rank(run);
  summary.precision = run.config.precision.types();
  summary.parameters = parameter_count(run.model->specs);
  summary.updated_parameters = static_cast<std::int64_t>(run.model->placement.moment_count);
  for (const auto& [group, totals] : run.ledgers.comm.by_group())
    for (int op = 0; op < comm_op_count; ++op)
      summary.comm_bytes_by_group[group][static_cast<std::size_t>(op)] =
          static_cast<double>(totals.bytes[static_cast<std::size_t>(op)]) / static_cast<double>(std::max<std::int64_t>(summary.steps, 1));
  // Exchanged experts' rows follow the routing: the counts the routing gave set the prediction.
  if (!run.model->moe_layers.empty() && summary.steps > 0)
    summary.prediction.set_comm(GroupKind::expert, CommOp::all_to_all,
                                std::llround(summary.routed_all_to_all_bytes_sum / static_cast<double>(summary.steps)));
  Communicator& world = run.world();
  std::vector<std::int64_t> all(static_cast<std::size_t>(memory_state_count * world.size()));
  world.all_gather(run_peak.data(), all.data(), memory_state_count);
  for (int rank = 0; rank < world.size(); ++rank) {
    MemoryByState peaks{};
    std::copy_n(all.begin() + rank * memory_state_count, memory_state_count, peaks.begin());
    summary.peak_memory_by_rank.push_back(peaks);
  }
}

void write_trace_file(Run& run) {
  if (!run.ledgers.trace) return;
  const Config& config = run.config;
  const GridShape& shape = run.groups->shape();
  nlohmann::json layout = {
      {"world", shape.world}, {"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp}, {"ep", shape.ep},
      {"strategies", run.model->strategies->names()},
      {"micro_batches", config.data.micro_batches},
      {"global_batch", config.data.global_batch}, {"layers", config.model.layers}};
  // Each strategy's settings (the schedule's theory among them, for the timeline to hold the
  // measured bubble to, and its chunks' places).
  for (const RunSetting& setting : run_settings(config, shape))
    std::visit([&](const auto& value) { layout[std::string(setting.name)] = value; }, setting.value);
  // Whether backward runs as B and W (this rank's actions say): with the pipeline's settings
  // (which global chunk each stage's local chunk is), a timeline need not know the schedule.
  layout["splits_backward"] = std::any_of(run.schedule.begin(), run.schedule.end(), [](const Action& action) {
    return action.kind == ActionKind::backward_input || action.kind == ActionKind::backward_weight;
  });
  agree_or_throw(run.world(), [&] {
    write_trace(config.output.trace_path, *run.ledgers.trace, run.ledgers.trace_origin_ms, run.mpi_world, run.groups->place(), layout);
  });
  run.reporter->line("wrote trace " + config.output.trace_path);
}

}  // namespace mlptrain
