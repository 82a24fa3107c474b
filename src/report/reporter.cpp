// Metrics, log lines and the summary (see reporter.hpp).
#include "report/reporter.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace mlptrain {

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
                           {"data_ms", record.data_ms},
                           {"update_ms", record.update_ms},
                           {"samples_per_s", record.samples_per_s},
                           {"model_tflops", record.model_tflops},
                           {"comm_bytes", comm_bytes},
                           {"comm_ms", comm_ms},
                           {"comm_busy_ms", record.comm_wall.busy_ms},
                           {"comm_wait_ms", record.comm_wall.wait_ms},
                           {"mem_bytes", by_state(record.memory)},
                           {"peak_mem_bytes", by_state(record.peak_memory)}};
  if (record.recompute_tflops > 0) object["recompute_tflops"] = record.recompute_tflops;
  if (record.mfu) object["mfu"] = *record.mfu;
  if (record.eval_loss) object["eval_loss"] = *record.eval_loss;
  if (record.eval_accuracy) object["eval_accuracy"] = *record.eval_accuracy;
  if (record.skipped) object["skipped"] = true;
  if (record.stopped) object["stopped"] = true;
  if (record.loss_scale) {
    object["loss_scale"] = *record.loss_scale;
    object["skipped_steps"] = record.skipped_steps;
  }
  if (record.checkpoint) object["checkpoint"] = checkpoint_json(*record.checkpoint);
  if (!record.expert_load.empty()) {
    object["expert_load"] = record.expert_load;
    object["dropped_tokens"] = record.dropped_tokens;
  }
  return object;
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
        "step {:>{}}/{}  loss {:.6f}  lr {:.3e}  grad_norm {:.4f}  {:.1f} ms (data {:.2f})  {:.0f} samples/s  "
        "{:.3g} TFLOP/s/rank",
        record.step, std::to_string(total_steps_).size(), total_steps_, record.loss, record.lr,
        record.grad_norm, record.step_ms, record.data_ms, record.samples_per_s, record.model_tflops);
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
      "summary: {} steps, median {:.2f} ms/step (data {:.2f}), median {:.0f} samples/s, {:.3g} model TFLOP/s per rank",
      summary.steps, object["step_ms"].get<double>(), object["data_ms"].get<double>(),
      object["samples_per_s"].get<double>(),
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
