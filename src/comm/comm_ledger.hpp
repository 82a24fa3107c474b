// The communication ledger: every collective and point-to-point transfer records its operation,
// group, size and time here. Sizes follow nccl-tests' size column (see DESIGN.md §2.4), so a
// ledger figure can be set beside a commbench or nccl-tests figure directly.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/comm_op.hpp"
#include "core/data_type.hpp"
#include "core/trace.hpp"

namespace mlptrain {

struct CommTotals {
  std::array<std::int64_t, comm_op_count> bytes{};
  std::array<double, comm_op_count> milliseconds{};
  std::array<std::int64_t, comm_op_count> calls{};

  std::int64_t bytes_of(CommOp op) const { return bytes[static_cast<int>(op)]; }
  double milliseconds_of(CommOp op) const { return milliseconds[static_cast<int>(op)]; }
};

// One of the latest operations a rank posted, as the hang watchdog reports it.
struct RecentOperation {
  std::uint64_t sequence = 0;  // this rank's count of operations posted before it
  CommOp op = CommOp::all_reduce;
  std::string group;
  std::int64_t bytes = 0;
  DataType type = DataType::float32;  // of its elements
  bool completed = false;
};

// A step's communication in wall time, as against the sum of its operations' times (which
// overlap, started operations among themselves and with blocking ones).
struct CommWallTime {
  double busy_ms = 0;  // while at least one operation that completed in the step was in flight
  double wait_ms = 0;  // while the caller was blocked in an operation or a wait for one
};

// An operation's bytes and call count belong to the step that posted it; its time (from posting
// to completion) to the step in which it completed. So an operation started at the end of one
// step and finished in the next (a parameter gather overlapping the next forward) counts its
// bytes where the work that needs it was done.
// The ledger also keeps the latest operations in a small ring that another thread may read (the
// watchdog that reports a hang), so that the ranks' last operations show where they diverged.
class CommLedger {
 public:
  // Returns the operation's sequence number, which its completion quotes.
  std::uint64_t record_posted(CommOp op, std::string_view group, std::int64_t bytes, DataType type);
  // An operation posted at start_ms (with `bytes` recorded then) is complete at end_ms.
  void record_completed(std::uint64_t sequence, CommOp op, std::string_view group, std::int64_t bytes,
                        DataType type, double start_ms, double end_ms);
  // The latest operations posted, oldest first (safe from any thread).
  std::vector<RecentOperation> recent() const;
  // Completed operations also go to `trace` as spans (null: no trace).
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

  // Time the caller spent blocked in a blocking operation or waiting for a started one.
  void record_wait(double milliseconds) { step_wait_ms_ += milliseconds; }

  // The step window: totals since the last begin_step().
  void begin_step();
  const CommTotals& step() const { return step_; }
  // The step's operations in wall time: the union of their spans since begin_step(), and the waits.
  CommWallTime step_wall_time() const;
  const CommTotals& run() const { return run_; }
  // Totals by group name over the whole run.
  const std::map<std::string, CommTotals, std::less<>>& by_group() const { return by_group_; }

 private:
  template <typename Update>
  void update(std::string_view group, Update&& change);

  static constexpr std::size_t recent_count = 16;
  mutable std::mutex recent_mutex_;
  std::vector<RecentOperation> recent_ = std::vector<RecentOperation>(recent_count);
  std::uint64_t posted_ = 0;
  TraceRecorder* trace_ = nullptr;
  CommTotals step_;
  double step_start_ms_ = 0;
  std::vector<std::pair<double, double>> step_spans_;  // (start, end) of the step's completions
  double step_wait_ms_ = 0;
  CommTotals run_;
  std::map<std::string, CommTotals, std::less<>> by_group_;
};

}  // namespace mlptrain
