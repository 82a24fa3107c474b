// The hang watchdog (--timeout SECONDS): a thread that wakes once a second and, if the step the
// loop last armed it for has run longer than the timeout, prints this rank's latest operations
// from the comm ledger (sequence number, operation, group, bytes, done or waiting) and aborts the
// job. Every rank runs one, so the reports of all ranks show where their sequences diverged: the
// rank that posted a different operation, or none, at the same place.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "comm/comm_ledger.hpp"

namespace mlptrain {

class Watchdog {
 public:
  // Inactive with timeout_s <= 0.
  Watchdog(double timeout_s, int rank, const CommLedger& ledger);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Work for `step` (1-based) starts now; it must end, or the next arm come, within the timeout.
  void arm(std::int64_t step);
  void disarm();

 private:
  void watch();
  [[noreturn]] void report_and_abort(std::int64_t step, double waited_s) const;

  const double timeout_s_;
  const int rank_;
  const CommLedger& ledger_;
  std::atomic<double> armed_at_ms_{-1};
  std::atomic<std::int64_t> step_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mlptrain
