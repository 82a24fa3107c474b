// The rank's communication engine (see comm_engine.hpp).
#include "comm/comm_engine.hpp"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>

#include "core/timer.hpp"

namespace mlptrain {

namespace {

// Rounds that moved nothing before the engine's thread sleeps between rounds rather than
// yielding, and its sleeps, doubling while nothing moves: a short wait (a copy about to land, a
// peer a few microseconds behind) stays quick, and a long one (a peer still computing its
// backward) costs the ranks' computation a few thousand wake-ups a second, not fifty thousand.
constexpr int yielding_rounds = 64;
constexpr std::chrono::microseconds first_sleep{10};
constexpr std::chrono::microseconds longest_sleep{200};

bool mpi_allows_threads() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

}  // namespace

CommEngine::CommEngine() {
  if (mpi_allows_threads()) thread_ = std::thread([this] { advance_in_background(); });
}

CommEngine::~CommEngine() {
  {
    const std::lock_guard lock(submitted_mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
  // A task kept and still in flight belongs to a run that is ending on an error: MPI may still
  // write into its host buffers until the job is torn down, so it is left allocated.
  for (std::unique_ptr<EngineTask>& task : kept_)
    if (!task->complete()) static_cast<void>(task.release());
}

void CommEngine::enqueue(EngineTask& task) {
  const std::lock_guard lock(submitted_mutex_);
  submitted_.push_back(&task);
  outstanding_.fetch_add(1, std::memory_order_relaxed);
}

void CommEngine::submit(EngineTask& task) {
  enqueue(task);
  work_.notify_one();
}

void CommEngine::submit_and_wait(EngineTask& task) {
  enqueue(task);
  wait(task);
}

bool CommEngine::thread_has_work() const {
  return outstanding_.load(std::memory_order_relaxed) > 0 && waiting_.load(std::memory_order_relaxed) == 0;
}

void CommEngine::keep(std::unique_ptr<EngineTask> task) {
  const std::lock_guard lock(submitted_mutex_);
  kept_.push_back(std::move(task));
}

bool CommEngine::advance_round() {
  {
    const std::lock_guard lock(submitted_mutex_);
    in_flight_.insert(in_flight_.end(), submitted_.begin(), submitted_.end());
    submitted_.clear();
  }
  bool moved = false;
  still_issuing_.clear();
  for (auto at = in_flight_.begin(); at != in_flight_.end();) {
    EngineTask& task = **at;
    const bool may_issue = std::find(still_issuing_.begin(), still_issuing_.end(), task.channel()) == still_issuing_.end();
    TaskProgress progress;
    try {
      progress = task.advance(may_issue);
    } catch (...) {
      // A task that failed (a device copy's error) is the engine's no longer: its owner unwinds.
      in_flight_.erase(at);
      outstanding_.fetch_sub(1, std::memory_order_relaxed);
      throw;
    }
    moved = moved || progress.moved;
    if (!progress.issued_all) still_issuing_.push_back(task.channel());
    if (!progress.complete) {
      ++at;
      continue;
    }
    // Last touch: once complete, its owner may free it (on its own thread, where its host memory
    // was allocated).
    at = in_flight_.erase(at);
    task.completed_at_ms_ = now_ms();
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    task.complete_.store(true, std::memory_order_release);
    moved = true;
  }
  return moved;
}

bool CommEngine::try_round() {
  const std::unique_lock lock(advancing_, std::try_to_lock);
  return lock.owns_lock() && advance_round();
}

bool CommEngine::test(const EngineTask& task) {
  if (task.complete()) return true;
  try_round();
  return task.complete();
}

void CommEngine::wait(const EngineTask& task) {
  advance_while([&] { return !task.complete(); });
}

void CommEngine::drain() {
  advance_while([&] { return outstanding_.load(std::memory_order_relaxed) > 0; });
}

template <typename Condition>
void CommEngine::advance_while(Condition&& condition) {
  waiting_.fetch_add(1, std::memory_order_relaxed);
  while (condition())
    if (!try_round()) sched_yield();
  {
    const std::lock_guard lock(submitted_mutex_);
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (thread_has_work()) work_.notify_one();  // the engine's thread takes over what is in flight
}

void CommEngine::advance_in_background() {
  // Sleeps as asked, not rounded up to the default 50 us of timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  int idle_rounds = 0;
  std::chrono::microseconds sleep = first_sleep;
  for (;;) {
    {
      // While a waiter advances the tasks, the thread stands aside: a second poller would only
      // take cores from the ranks.
      std::unique_lock lock(submitted_mutex_);
      work_.wait(lock, [this] { return stopping_ || thread_has_work(); });
      if (stopping_) return;
    }
    bool moved = false;
    try {
      moved = try_round();
    } catch (const std::exception& error) {
      // No caller to hand the error to on this thread: the job ends as on any rank's unexpected
      // error (mpi_program.hpp), not left waiting.
      std::fprintf(stderr, "mlptrain: error: communication engine: %s\n", error.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (moved) {
      idle_rounds = 0;
      sleep = first_sleep;
    } else if (++idle_rounds < yielding_rounds) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(2 * sleep, longest_sleep);
    }
  }
}

}  // namespace mlptrain
