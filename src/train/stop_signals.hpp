// Stop signals: what a scheduler sends a job it is about to end (Slurm: SIGTERM at preemption and
// at the time limit, or the signal `--signal` names; mpiexec and srun forward them to every rank).
// While the loop runs, SIGTERM, SIGINT and SIGUSR1 do not end the process: the handler notes the
// signal, and the loop stops at the next step boundary every rank agrees on, saves, and exits
// with ExitCode::stopped. A handler can reach no object, so the note is one process-wide atomic,
// written by the handler only; this class installs the handler for its lifetime and reads it.
#pragma once

#include <signal.h>

#include <array>
#include <string_view>

namespace mlptrain {

class StopSignals {
 public:
  StopSignals();   // installs the handler (the previous dispositions are kept)
  ~StopSignals();  // restores them
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal received since the handler was installed, or 0.
  int received() const;
  // "SIGTERM" and the like.
  static std::string_view name(int signal);

 private:
  std::array<struct sigaction, 3> previous_{};  // SIGTERM's, SIGINT's and SIGUSR1's
};

}  // namespace mlptrain
