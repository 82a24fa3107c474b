// What a run tells its user: one JSON object per step in the metrics file (DESIGN.md §2.4), a
// readable log line every --log-every steps, a progress line with ETA when stdout is a terminal,
// and the end-of-run summary with predicted and measured memory and communication side by side.
// Only rank 0 writes; the other ranks contribute through the trainer's gathers.
#pragma once


#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_ledger.hpp"
#include "core/memory_ledger.hpp"
#include "core/precision.hpp"
#include "cost/prediction.hpp"
#include "train/run_summary.hpp"

namespace mlptrain {

struct StepRecord {
  std::int64_t step = 0;  // optimizer steps done
  double loss = 0;
  double aux_loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double data_ms = 0;  // of the step, the time a rank waited for its samples (mean over ranks)
  double samples_per_s = 0;
  // Per rank: the model's FLOPs of the step (6 per weight and sample) and recomputation's extra
  // forward, over the step's time; the model's share of the rank's peak where that is known.
  double model_tflops = 0;
  double recompute_tflops = 0;
  std::optional<double> mfu;
  CommTotals comm;
  MemoryByState memory{};
  MemoryByState peak_memory{};
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  bool skipped = false;  // non-finite loss or gradients: the update was not applied
  // fp16's loss scale the step's gradients were computed with, and the steps skipped so far for
  // overflowing gradients (none without loss scaling).
  std::optional<double> loss_scale;
  std::int64_t skipped_steps = 0;
  // MoE layers (empty without): global assignments per expert of each MoE layer over the step,
  // assignments dropped at capacity, and the all-to-all bytes this rank's routing counts give.
  std::vector<std::vector<std::int64_t>> expert_load;
  std::int64_t dropped_tokens = 0;
  double routed_all_to_all_bytes = 0;
  std::optional<SavedCheckpoint> checkpoint;  // a save that ended with this step
};

nlohmann::json step_json(const StepRecord& record);

class Reporter {
 public:
  // Inactive (writes nothing) unless `active`; throws UsageError if the metrics file cannot be
  // opened.
  Reporter(bool active, const std::string& metrics_path, int log_every, std::int64_t total_steps);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  void line(const std::string& text);  // a log line (clears the progress line first)
  void step(const StepRecord& record);
  void summary(const RunSummary& summary);
  // --predict: the predicted table, and with --metrics one JSON object (`"predict": true`, the
  // dtypes and the parameter count beside `placement` and `comm_per_step` without measurements).
  void prediction(const Prediction& prediction, const Precision& precision, std::int64_t parameters);

 private:
  bool active_;
  int log_every_;
  std::int64_t total_steps_;
  std::FILE* metrics_ = nullptr;
  bool terminal_ = false;
  bool progress_shown_ = false;
  double started_ms_ = 0;
  double progress_shown_ms_ = 0;
  std::int64_t first_step_ = -1;
};

}  // namespace mlptrain
