// Metrics, log lines and the summary (see report.hpp).
#include "train/report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace mlptrain {

namespace {

nlohmann::json by_state(const MemoryByState& bytes) {
  nlohmann::json object = nlohmann::json::object();
  for (MemoryState state : all_memory_states)
    object[std::string(memory_state_name(state))] = bytes[static_cast<int>(state)];
  return object;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[unit]);
}

bool offloaded(const Prediction& prediction, MemoryState state) {
  return prediction.state(state).mode == PlacementMode::offloaded;
}

}  // namespace

void RunSummary::add(const StepRecord& record) {
  ++steps;
  step_ms.push_back(record.step_ms);
  samples_per_s.push_back(record.samples_per_s);
  model_tflops.push_back(record.model_tflops);
  if (record.mfu) mfu.push_back(*record.mfu);
  for (int op = 0; op < comm_op_count; ++op) comm_bytes_sum[op] += static_cast<double>(record.comm.bytes[op]);
  final_loss = record.loss;
  routed_all_to_all_bytes_sum += record.routed_all_to_all_bytes;
}

std::array<double, comm_op_count> RunSummary::mean_comm_bytes() const {
  std::array<double, comm_op_count> mean = comm_bytes_sum;
  if (steps > 0)
    for (double& value : mean) value /= static_cast<double>(steps);
  return mean;
}

std::int64_t RunSummary::measured_bytes(MemoryState state) const {
  const auto index = static_cast<int>(state);
  return offloaded(prediction, state) ? peak_host_memory[index] : peak_memory[index];
}

nlohmann::json step_json(const StepRecord& record) {
  nlohmann::json comm_bytes = nlohmann::json::object(), comm_ms = nlohmann::json::object();
  for (CommOp op : training_comm_ops) {
    comm_bytes[std::string(comm_op_name(op))] = record.comm.bytes_of(op);
    comm_ms[std::string(comm_op_name(op))] = record.comm.milliseconds_of(op);
  }
  nlohmann::json object = {{"step", record.step},
                           {"loss", record.loss},
                           {"aux_loss", record.aux_loss},
                           {"lr", record.lr},
                           {"grad_norm", record.grad_norm},
                           {"step_ms", record.step_ms},
                           {"samples_per_s", record.samples_per_s},
                           {"model_tflops", record.model_tflops},
                           {"comm_bytes", comm_bytes},
                           {"comm_ms", comm_ms},
                           {"mem_bytes", by_state(record.memory)},
                           {"peak_mem_bytes", by_state(record.peak_memory)}};
  if (record.recompute_tflops > 0) object["recompute_tflops"] = record.recompute_tflops;
  if (record.mfu) object["mfu"] = *record.mfu;
  if (record.eval_loss) object["eval_loss"] = *record.eval_loss;
  if (record.eval_accuracy) object["eval_accuracy"] = *record.eval_accuracy;
  if (record.skipped) object["skipped"] = true;
  if (record.loss_scale) {
    object["loss_scale"] = *record.loss_scale;
    object["skipped_steps"] = record.skipped_steps;
  }
  if (!record.expert_load.empty()) {
    object["expert_load"] = record.expert_load;
    object["dropped_tokens"] = record.dropped_tokens;
  }
  return object;
}

namespace {

// The predicted bytes per step of each (group, operation) that moves any.
struct GroupBytes {
  GroupKind group = GroupKind::world;
  CommOp op = CommOp::all_reduce;
  std::int64_t bytes = 0;
};
std::vector<GroupBytes> predicted_bytes_by_group(const Prediction& prediction) {
  std::vector<GroupBytes> rows;
  for (GroupKind group : all_group_kinds)
    for (CommOp op : training_comm_ops)
      if (const std::int64_t bytes = prediction.comm(group, op); bytes > 0)
        rows.push_back({.group = group, .op = op, .bytes = bytes});
  return rows;
}

// The placement and communication tables as JSON: predicted bytes, and measured ones when given.
std::pair<nlohmann::json, nlohmann::json> prediction_json(const Prediction& prediction, const RunSummary* measured) {
  nlohmann::json placement = nlohmann::json::object();
  for (MemoryState state : placed_states) {
    const StatePrediction& predicted = prediction.state(state);
    nlohmann::json& entry = placement[std::string(memory_state_name(state))];
    entry = {{"mode", mode_code(predicted.mode)}, {"predicted_bytes", predicted.bytes}};
    if (measured != nullptr) entry["measured_bytes"] = measured->measured_bytes(state);
    if (offloaded(prediction, state)) entry["memory"] = "host";
  }
  const auto means = measured != nullptr ? measured->mean_comm_bytes() : std::array<double, comm_op_count>{};
  nlohmann::json comm = nlohmann::json::object();
  for (CommOp op : training_comm_ops) {
    const int index = static_cast<int>(op);
    nlohmann::json& entry = comm[std::string(comm_op_name(op))];
    entry = {{"predicted_bytes", prediction.comm(op)}};
    if (measured != nullptr) entry["measured_bytes"] = means[index];
  }
  return {placement, comm};
}

void add_precision(nlohmann::json& object, const Precision& precision) {
  object["param_dtype"] = data_type_name(precision.param);
  object["reduce_dtype"] = data_type_name(precision.reduce);
}

}  // namespace

nlohmann::json summary_json(const RunSummary& summary) {
  const auto [placement, comm] = prediction_json(summary.prediction, &summary);
  nlohmann::json by_rank = nlohmann::json::array();
  for (const MemoryByState& peaks : summary.peak_memory_by_rank) by_rank.push_back(by_state(peaks));
  nlohmann::json object = {{"summary", true},
                           {"steps", summary.steps},
                           {"step_ms", median(summary.step_ms)},
                           {"samples_per_s", median(summary.samples_per_s)},
                           {"model_tflops", median(summary.model_tflops)},
                           {"peak_mem_bytes", by_state(summary.peak_memory)},
                           {"peak_mem_bytes_by_rank", by_rank},
                           {"placement", placement},
                           {"comm_per_step", comm}};
  add_precision(object, summary.precision);
  object["parameters"] = summary.parameters;
  nlohmann::json by_group = nlohmann::json::object();
  for (const auto& [group, bytes] : summary.comm_bytes_by_group)
    for (CommOp op : training_comm_ops)
      if (bytes[static_cast<int>(op)] > 0) by_group[group][std::string(comm_op_name(op))] = bytes[static_cast<int>(op)];
  object["comm_bytes_by_group"] = by_group;
  nlohmann::json predicted_by_group = nlohmann::json::object();
  for (const GroupBytes& entry : predicted_bytes_by_group(summary.prediction))
    predicted_by_group[std::string(group_name(entry.group))][std::string(comm_op_name(entry.op))] = entry.bytes;
  object["predicted_comm_bytes_by_group"] = predicted_by_group;
  if (summary.steps > 0) object["final_loss"] = summary.final_loss;
  if (!summary.mfu.empty()) object["mfu"] = median(summary.mfu);
  if (std::any_of(summary.peak_host_memory.begin(), summary.peak_host_memory.end(),
                  [](std::int64_t bytes) { return bytes > 0; }))
    object["peak_host_mem_bytes"] = by_state(summary.peak_host_memory);
  return object;
}

std::string placement_table(const Prediction& prediction, const RunSummary* measured) {
  std::string text = fmt::format("  {:<18}{:>6}{:>16}", "state", "mode", "predicted");
  if (measured) text += fmt::format("{:>16}{:>11}", "measured", "deviation");
  text += "\n";
  for (MemoryState state : placed_states) {
    const auto predicted = static_cast<double>(prediction.state(state).bytes);
    text += fmt::format("  {:<18}{:>6}{:>16}",
                        fmt::format("{}{}", memory_state_name(state), offloaded(prediction, state) ? " (host)" : ""),
                        mode_code(prediction.state(state).mode), human_bytes(predicted));
    if (measured) {
      const auto actual = static_cast<double>(measured->measured_bytes(state));
      text += fmt::format("{:>16}{:>10.1f}%", human_bytes(actual),
                          predicted > 0 ? 100.0 * (actual - predicted) / predicted : 0.0);
    }
    text += "\n";
  }
  text += fmt::format("  {:<24}{:>16}", "comm per step", "predicted");
  if (measured) text += fmt::format("{:>16}", "measured");
  text += "\n";
  const auto means = measured ? measured->mean_comm_bytes() : std::array<double, comm_op_count>{};
  for (CommOp op : training_comm_ops) {
    const int index = static_cast<int>(op);
    if (prediction.comm(op) == 0 && means[index] == 0) continue;
    text += fmt::format("  {:<24}{:>16}", comm_op_name(op),
                        human_bytes(static_cast<double>(prediction.comm(op))));
    if (measured) text += fmt::format("{:>16}", human_bytes(means[index]));
    text += "\n";
  }
  // By group (the loop's world sums aside), where more than one group shares the operations:
  // which link each byte takes.
  std::vector<GroupBytes> rows = predicted_bytes_by_group(prediction);
  std::erase_if(rows, [](const GroupBytes& row) { return row.group == GroupKind::world; });
  if (rows.empty() || std::ranges::all_of(rows, [&](const GroupBytes& row) { return row.group == rows.front().group; }))
    return text;
  for (const GroupBytes& row : rows) {
    const std::string group(group_name(row.group));
    text += fmt::format("  {:<24}{:>16}", fmt::format("{} {}", group, comm_op_name(row.op)),
                        human_bytes(static_cast<double>(row.bytes)));
    if (measured) {
      const auto found = measured->comm_bytes_by_group.find(group);
      const bool seen = found != measured->comm_bytes_by_group.end();
      text += fmt::format("{:>16}", human_bytes(seen ? found->second[static_cast<std::size_t>(row.op)] : 0.0));
    }
    text += "\n";
  }
  return text;
}

Reporter::Reporter(bool active, const std::string& metrics_path, int log_every,
                   std::int64_t total_steps)
    : active_(active), log_every_(log_every), total_steps_(total_steps) {
  if (!active_) return;
  terminal_ = isatty(STDOUT_FILENO) != 0;
  if (!metrics_path.empty()) {
    metrics_ = std::fopen(metrics_path.c_str(), "w");
    if (metrics_ == nullptr) throw UsageError("--metrics: cannot write '" + metrics_path + "'");
  }
}

Reporter::~Reporter() {
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void Reporter::line(const std::string& text) {
  if (!active_) return;
  if (progress_shown_) std::fputs("\r\033[K", stdout);
  progress_shown_ = false;
  std::fputs((text + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void Reporter::step(const StepRecord& record) {
  if (!active_) return;
  if (first_step_ < 0) {
    first_step_ = record.step;
    started_ms_ = now_ms() - record.step_ms;
  }
  if (metrics_ != nullptr) {
    std::fputs((step_json(record).dump() + "\n").c_str(), metrics_);
    std::fflush(metrics_);
  }
  const bool due = log_every_ > 0 && (record.step % log_every_ == 0 || record.step == total_steps_ ||
                                      record.step == first_step_);
  if (due) {
    std::string text = fmt::format(
        "step {:>{}}/{}  loss {:.6f}  lr {:.3e}  grad_norm {:.4f}  {:.1f} ms  {:.0f} samples/s  {:.3g} "
        "TFLOP/s/rank",
        record.step, std::to_string(total_steps_).size(), total_steps_, record.loss, record.lr,
        record.grad_norm, record.step_ms, record.samples_per_s, record.model_tflops);
    if (record.mfu) text += fmt::format("  MFU {:.1f}%", 100 * *record.mfu);
    if (!record.expert_load.empty())
      text += fmt::format("  aux_loss {:.6f}  dropped {}", record.aux_loss, record.dropped_tokens);
    if (record.eval_loss) text += fmt::format("  eval_loss {:.6f}", *record.eval_loss);
    if (record.eval_accuracy) text += fmt::format("  eval_accuracy {:.4f}", *record.eval_accuracy);
    if (record.loss_scale) text += fmt::format("  loss_scale {:g}", *record.loss_scale);
    if (record.skipped) text += "  (non-finite: update skipped)";
    line(text);
  }
  // The progress line is redrawn at most ten times a second.
  if (terminal_ && record.step < total_steps_ && now_ms() - progress_shown_ms_ >= 100.0) {
    progress_shown_ms_ = now_ms();
    const double elapsed_s = (now_ms() - started_ms_) / 1000.0;
    const double done = static_cast<double>(record.step - first_step_ + 1);
    const double eta_s = elapsed_s / done * static_cast<double>(total_steps_ - record.step);
    std::fputs(fmt::format("\r\033[Kstep {}/{}  loss {:.6f}  ETA {:.0f} s", record.step,
                           total_steps_, record.loss, eta_s).c_str(), stdout);
    std::fflush(stdout);
    progress_shown_ = true;
  }
}

void Reporter::prediction(const Prediction& prediction, const Precision& precision, std::int64_t parameters) {
  if (!active_) return;
  if (metrics_ != nullptr) {
    const auto [placement, comm] = prediction_json(prediction, nullptr);
    nlohmann::json object = {{"predict", true}, {"parameters", parameters}, {"placement", placement},
                             {"comm_per_step", comm}};
    add_precision(object, precision);
    std::fputs((object.dump() + "\n").c_str(), metrics_);
    std::fflush(metrics_);
  }
  line("predicted memory of rank 0 and communication per step:\n" + placement_table(prediction, nullptr));
}

void Reporter::summary(const RunSummary& summary) {
  if (!active_) return;
  const nlohmann::json object = summary_json(summary);
  if (metrics_ != nullptr) {
    std::fputs((object.dump() + "\n").c_str(), metrics_);
    std::fflush(metrics_);
  }
  std::string text = fmt::format(
      "summary: {} steps, median {:.2f} ms/step, median {:.0f} samples/s, {:.3g} model TFLOP/s per rank",
      summary.steps, object["step_ms"].get<double>(), object["samples_per_s"].get<double>(),
      object["model_tflops"].get<double>());
  if (object.contains("mfu")) text += fmt::format(" (MFU {:.1f}%)", 100 * object["mfu"].get<double>());
  if (summary.steps > 0) text += fmt::format(", final loss {:.6f}", summary.final_loss);
  text += "\nrank 0 memory (peak) and communication, predicted vs measured:\n";
  text += placement_table(summary.prediction, &summary);
  text += "peak memory by rank:\n";
  for (std::size_t rank = 0; rank < summary.peak_memory_by_rank.size(); ++rank) {
    text += fmt::format("  rank {}:", rank);
    for (MemoryState state : all_memory_states)
      text += fmt::format(" {} {}", memory_state_name(state),
                          human_bytes(static_cast<double>(
                              summary.peak_memory_by_rank[rank][static_cast<int>(state)])));
    text += "\n";
  }
  text.pop_back();
  line(text);
}

}  // namespace mlptrain
