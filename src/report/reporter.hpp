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
#include "report/run_summary.hpp"
#include "report/step_record.hpp"

namespace mlptrain {

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
