// A rank's communication engine: every MPI operation of the rank's communicators is a task queued
// here, and a thread of the engine's own advances the tasks in flight (issues their MPI calls,
// tests them, moves staged pieces between device and host) while the thread that launches the
// kernels goes on. That thread blocks only where it waits for a task's result, and while it
// waits it advances the tasks itself (a blocking operation costs no hand-over) and the engine's
// thread stands aside: one thread per rank polls, not two, which matters where ranks share
// cores.
//
// MPI is initialized with MPI_THREAD_MULTIPLE: the engine's thread and the caller's may both be
// inside MPI (the caller in setup, barriers and parallel HDF5, the engine in every operation).
// Funnelling all of it through the engine would put parallel HDF5's own MPI calls out of reach.
// Where MPI offers less, the engine keeps no thread and tasks advance only while a caller tests
// or waits, as MPI's own non-blocking operations do.
//
// MPI requires every rank to issue a communicator's collectives in one order, and a peer's
// messages of one tag in the order its receives expect. Tasks declare the channel they issue on;
// a task issues only once every earlier task on its channel has issued all its calls. Tasks on
// different channels issue as they become ready, and every task in flight is tested on every
// round, so no task waits for a peer behind another.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace mlptrain {

// The calls a task's must follow in submission order: a communicator's collectives, or its
// messages to (or from) one peer.
struct IssueChannel {
  enum class Kind { collective, send, receive };
  MPI_Comm comm = MPI_COMM_NULL;
  Kind kind = Kind::collective;
  int peer = -1;
  bool operator==(const IssueChannel&) const = default;
};

// What one round of a task's advance did.
struct TaskProgress {
  bool moved = false;      // something was issued, completed or copied
  bool issued_all = true;  // every MPI call of the task is issued
  bool complete = false;   // its result is where the caller wants it
};

class EngineTask {
 public:
  explicit EngineTask(IssueChannel channel) : channel_(channel) {}
  virtual ~EngineTask() = default;
  EngineTask(const EngineTask&) = delete;
  EngineTask& operator=(const EngineTask&) = delete;

  const IssueChannel& channel() const { return channel_; }
  bool complete() const { return complete_.load(std::memory_order_acquire); }
  // When the engine saw it complete (ms, core/timer.hpp's clock); valid once complete().
  double completed_at_ms() const { return completed_at_ms_; }

  // One round without blocking: issues what is ready (only when `may_issue`: no earlier task on
  // the channel is still issuing), tests what is in flight. Called by one thread at a time.
  virtual TaskProgress advance(bool may_issue) = 0;

 private:
  friend class CommEngine;
  IssueChannel channel_;
  std::atomic<bool> complete_{false};
  double completed_at_ms_ = 0;
};

class CommEngine {
 public:
  CommEngine();
  ~CommEngine();
  CommEngine(const CommEngine&) = delete;
  CommEngine& operator=(const CommEngine&) = delete;

  // Queues `task` behind the tasks submitted before it. From the thread that owns the
  // communicators (the order of submission is the order of the program). The caller keeps the
  // task alive until it is complete, or hands it over with keep().
  void submit(EngineTask& task);
  // Queues `task` and waits for it: the caller advances it (the engine's thread is not woken).
  void submit_and_wait(EngineTask& task);
  // Takes over a task whose owner is going away before it completed (a run ending on an error).
  void keep(std::unique_ptr<EngineTask> task);
  // Advances the tasks once unless the engine's thread is doing so; whether `task` is complete.
  bool test(const EngineTask& task);
  // Advances the tasks until `task` is complete.
  void wait(const EngineTask& task);
  // Waits until every task submitted is complete (before a call into MPI outside the engine on
  // a communicator that may have tasks in flight).
  void drain();
  // Whether a thread of the engine's own advances tasks (MPI gave MPI_THREAD_MULTIPLE).
  bool threaded() const { return thread_.joinable(); }

 private:
  // One round over every task in flight; true if any moved. Needs advancing_ held.
  bool advance_round();
  // Runs one round if no other thread is; whether it moved anything.
  bool try_round();
  void enqueue(EngineTask& task);
  // Whether the engine's thread has work: tasks in flight and no waiter advancing them.
  bool thread_has_work() const;
  // Advances the tasks on the calling thread while `condition` holds (the engine's thread
  // stands aside meanwhile).
  template <typename Condition>
  void advance_while(Condition&& condition);
  // The engine's thread: advances the tasks whenever there are some and no waiter does.
  void advance_in_background();

  std::mutex submitted_mutex_;
  std::vector<EngineTask*> submitted_;  // not yet taken into a round
  std::vector<std::unique_ptr<EngineTask>> kept_;
  std::condition_variable work_;
  bool stopping_ = false;
  std::atomic<int> outstanding_{0};  // submitted and not complete

  std::atomic<int> waiting_{0};  // callers in wait() or drain(), advancing the tasks themselves
  std::mutex advancing_;  // held by the thread running a round
  std::vector<EngineTask*> in_flight_;       // in submission order (advancing_)
  std::vector<IssueChannel> still_issuing_;  // a round's scratch (advancing_)

  std::thread thread_;
};

}  // namespace mlptrain
