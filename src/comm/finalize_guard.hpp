// A bound on how long the end of an MPI program may take once every rank's work is done.
//
// Some transports can hang in MPI_Finalize: UCX 1.13 over TCP flushes an endpoint whose peer has
// already moved on to the process manager's final barrier and never progresses it again
// (openucx/ucx#8738), and the job would never end. While a guard lives, a thread of its own
// waits; if the guard is not destroyed within the grace period, it prints one line and ends the
// process with the exit code the program would have returned (what the program printed is
// flushed first; its results are written by then).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace mlptrain {

class FinalizeGuard {
 public:
  FinalizeGuard(const char* program, int rank, int exit_code, std::chrono::milliseconds grace);
  FinalizeGuard(const FinalizeGuard&) = delete;
  FinalizeGuard& operator=(const FinalizeGuard&) = delete;
  ~FinalizeGuard();

 private:
  void watch();

  const char* const program_;
  const int rank_;
  const int exit_code_;
  const std::chrono::milliseconds grace_;
  std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the members it reads exist
};

}  // namespace mlptrain
