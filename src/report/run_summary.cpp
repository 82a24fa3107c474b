// The end-of-run summary and the prediction tables (see run_summary.hpp).
#include "report/run_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report/step_record.hpp"

namespace mlptrain {

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

namespace {

bool offloaded(const Prediction& prediction, MemoryState state) {
  return prediction.state(state).mode == PlacementMode::offloaded;
}

}  // namespace

void RunSummary::add(const StepRecord& record) {
  ++steps;
  step_ms.push_back(record.step_ms);
  data_ms.push_back(record.data_ms);
  update_ms.push_back(record.update_ms);
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

}  // namespace

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

nlohmann::json checkpoint_json(const SavedCheckpoint& checkpoint) {
  return {{"file", checkpoint.file},
          {"step", checkpoint.step},
          {"bytes", checkpoint.bytes},
          {"seconds", checkpoint.seconds},
          {"gb_per_s", checkpoint.gigabytes_per_second()},
          {"paused_ms", checkpoint.paused_ms}};
}

std::string saved_line(const SavedCheckpoint& checkpoint) {
  return fmt::format("saved checkpoint {} ({:.3f} GB in {:.2f} s: {:.2f} GB/s; training paused {:.0f} ms)",
                     checkpoint.file, static_cast<double>(checkpoint.bytes) / 1e9, checkpoint.seconds,
                     checkpoint.gigabytes_per_second(), checkpoint.paused_ms);
}

void add_precision(nlohmann::json& object, const Precision& precision) {
  object["param_dtype"] = data_type_name(precision.param);
  object["reduce_dtype"] = data_type_name(precision.reduce);
}

nlohmann::json summary_json(const RunSummary& summary) {
  const auto [placement, comm] = prediction_json(summary.prediction, &summary);
  nlohmann::json by_rank = nlohmann::json::array();
  for (const MemoryByState& peaks : summary.peak_memory_by_rank) by_rank.push_back(by_state(peaks));
  nlohmann::json object = {{"summary", true},
                           {"steps", summary.steps},
                           {"step_ms", median(summary.step_ms)},
                           {"data_ms", median(summary.data_ms)},
                           {"update_ms", median(summary.update_ms)},
                           {"samples_per_s", median(summary.samples_per_s)},
                           {"model_tflops", median(summary.model_tflops)},
                           {"peak_mem_bytes", by_state(summary.peak_memory)},
                           {"peak_mem_bytes_by_rank", by_rank},
                           {"placement", placement},
                           {"comm_per_step", comm}};
  add_precision(object, summary.precision);
  object["parameters"] = summary.parameters;
  object["updated_parameters"] = summary.updated_parameters;
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
  if (!summary.checkpoints.empty()) {
    object["checkpoints"] = nlohmann::json::array();
    for (const SavedCheckpoint& checkpoint : summary.checkpoints) object["checkpoints"].push_back(checkpoint_json(checkpoint));
  }
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

}  // namespace mlptrain
