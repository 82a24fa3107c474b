// The stop signals' handler (see stop_signals.hpp).
#include "train/stop_signals.hpp"

#include <atomic>

namespace mlptrain {

namespace {

constexpr std::array<int, 3> stop_signal_numbers = {SIGTERM, SIGINT, SIGUSR1};  // as previous_ keeps them

// Written by the handler only (lock-free, so safe there); the first signal wins: a second one
// during the save that follows changes nothing (the save is atomic either way).
std::atomic<int> first_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

void note(int signal) {
  int none = 0;
  first_received.compare_exchange_strong(none, signal);
}

}  // namespace

StopSignals::StopSignals() {
  first_received.store(0);
  struct sigaction action {};
  action.sa_handler = note;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // calls in progress (a write, a wait in MPI) go on
  for (std::size_t index = 0; index < stop_signal_numbers.size(); ++index)
    sigaction(stop_signal_numbers[index], &action, &previous_[index]);
}

StopSignals::~StopSignals() {
  for (std::size_t index = 0; index < stop_signal_numbers.size(); ++index)
    sigaction(stop_signal_numbers[index], &previous_[index], nullptr);
}

int StopSignals::received() const { return first_received.load(); }

std::string_view StopSignals::name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace mlptrain
