// The bound on an MPI program's teardown (see finalize_guard.hpp).
#include "comm/finalize_guard.hpp"

#include <cstdio>
#include <cstdlib>

namespace mlptrain {

FinalizeGuard::FinalizeGuard(const char* program, int rank, int exit_code, std::chrono::milliseconds grace)
    : program_(program), rank_(rank), exit_code_(exit_code), grace_(grace), thread_([this] { watch(); }) {}

FinalizeGuard::~FinalizeGuard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  finished_.notify_one();
  thread_.join();
}

void FinalizeGuard::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_.wait_for(lock, grace_, [this] { return done_; })) return;
  std::fprintf(stderr,
               "%s: rank %d: MPI_Finalize has not returned %g s after the work ended (the transport's "
               "teardown); ending with exit code %d\n",
               program_, rank_, std::chrono::duration<double>(grace_).count(), exit_code_);
  std::fflush(nullptr);
  std::_Exit(exit_code_);
}

}  // namespace mlptrain
