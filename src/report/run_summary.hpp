// The end-of-run summary: what it keeps of the steps, and rank 0's predicted memory and
// communication beside the measured figures, as the summary's JSON and as the log's table.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_ledger.hpp"
#include "core/memory_ledger.hpp"
#include "core/precision.hpp"
#include "cost/prediction.hpp"
#include "io/checkpoint.hpp"

namespace mlptrain {

struct StepRecord;  // report/step_record.hpp

// What the end-of-run summary needs of the steps, kept compact: a long run adds 32 bytes a step.
struct RunSummary {
  std::int64_t steps = 0;
  std::vector<double> step_ms;
  std::vector<double> data_ms;
  std::vector<double> update_ms;
  std::vector<double> samples_per_s;
  std::vector<double> model_tflops;
  std::vector<double> mfu;
  std::array<double, comm_op_count> comm_bytes_sum{};
  double final_loss = 0;
  double routed_all_to_all_bytes_sum = 0;
  std::vector<MemoryByState> peak_memory_by_rank;
  std::vector<SavedCheckpoint> checkpoints;  // every save that ended, in order
  MemoryByState peak_memory{};       // rank 0's, over the whole run
  MemoryByState peak_host_memory{};  // rank 0's offloaded memory, over the whole run
  Prediction prediction;
  Precision precision;
  std::int64_t parameters = 0;  // the whole model's
  std::int64_t updated_parameters = 0;  // rank 0's optimizer's (its shard under ZeRO)
  // Rank 0's bytes by group and operation over the run (evaluation included), per training step.
  std::map<std::string, std::array<double, comm_op_count>> comm_bytes_by_group;

  void add(const StepRecord& record);
  std::array<double, comm_op_count> mean_comm_bytes() const;
  // Rank 0's measured peak of a placed state: in host memory when it is offloaded.
  std::int64_t measured_bytes(MemoryState state) const;
};

nlohmann::json summary_json(const RunSummary& summary);
// A save that ended: as JSON (a step's "checkpoint", the summary's "checkpoints") and as a log line.
nlohmann::json checkpoint_json(const SavedCheckpoint& checkpoint);
std::string saved_line(const SavedCheckpoint& checkpoint);

// The predicted-vs-measured tables as text (measured columns omitted when `measured` is null).
std::string placement_table(const Prediction& prediction, const RunSummary* measured);

// The placement and communication tables as JSON: predicted bytes, and measured ones when given.
std::pair<nlohmann::json, nlohmann::json> prediction_json(const Prediction& prediction, const RunSummary* measured);
void add_precision(nlohmann::json& object, const Precision& precision);
// Bytes with a binary unit ("1.50 MiB").
std::string human_bytes(double bytes);
double median(std::vector<double> values);
// Bytes per memory state as a JSON object keyed by the states' names.
nlohmann::json by_state(const MemoryByState& bytes);

}  // namespace mlptrain
