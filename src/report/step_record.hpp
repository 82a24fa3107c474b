// One step's record as the trainer gathers it: what the metrics file's object (DESIGN.md §2.4)
// and the log line say of the step, and what the end-of-run summary keeps of it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/comm_ledger.hpp"
#include "core/memory_ledger.hpp"
#include "io/checkpoint.hpp"

namespace mlptrain {

struct StepRecord {
  std::int64_t step = 0;  // optimizer steps done
  double loss = 0;
  double aux_loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double data_ms = 0;  // of the step, the time a rank waited for its samples (mean over ranks)
  // Rank 0's optimizer update alone (AdamW over the parameters it owns), host time: on a GPU the
  // time to queue it. mlpplan --calibrate plans the optimizer from it as the loop runs it.
  double update_ms = 0;
  double samples_per_s = 0;
  // Per rank: the model's FLOPs of the step (6 per weight and sample) and recomputation's extra
  // forward, over the step's time; the model's share of the rank's peak where that is known.
  double model_tflops = 0;
  double recompute_tflops = 0;
  std::optional<double> mfu;
  CommTotals comm;
  CommWallTime comm_wall;
  MemoryByState memory{};
  MemoryByState peak_memory{};
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  bool skipped = false;  // non-finite loss or gradients: the update was not applied
  bool stopped = false;  // a rank received a stop signal: the run ends with this step
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

}  // namespace mlptrain
