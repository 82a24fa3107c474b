// The hang watchdog (see watchdog.hpp).
#include "train/watchdog.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <string>

#include "core/timer.hpp"

namespace mlptrain {

Watchdog::Watchdog(double timeout_s, int rank, const CommLedger& ledger)
    : timeout_s_(timeout_s), rank_(rank), ledger_(ledger) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::arm(std::int64_t step) {
  step_ = step;
  armed_at_ms_ = now_ms();
}

void Watchdog::disarm() { armed_at_ms_ = -1; }

void Watchdog::watch() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; })) {
    const double armed_at_ms = armed_at_ms_;
    if (armed_at_ms < 0) continue;
    const double waited_s = (now_ms() - armed_at_ms) / 1000.0;
    if (waited_s > timeout_s_) report_and_abort(step_, waited_s);
  }
}

void Watchdog::report_and_abort(std::int64_t step, double waited_s) const {
  std::string text = fmt::format(
      "mlptrain: watchdog: rank {}: step {} has not finished after {:.0f} s (--timeout {:g}); "
      "its last operations, oldest first:\n",
      rank_, step, waited_s, timeout_s_);
  for (const RecentOperation& operation : ledger_.recent())
    text += fmt::format("mlptrain: watchdog: rank {}:   #{} {} on {} ({} bytes of {}) {}\n", rank_,
                        operation.sequence, comm_op_name(operation.op), operation.group, operation.bytes,
                        data_type_name(operation.type), operation.completed ? "done" : "WAITING");
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  // The other ranks' watchdogs fire about now too: give their reports time to come out before
  // the job ends.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace mlptrain
