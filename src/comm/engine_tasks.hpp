// What communicators hand the communication engine (comm_engine.hpp): an operation started by one
// call once its channel allows and then tested (MPI's non-blocking calls, a shared window's), and
// the handle of a started operation the engine runs.
#pragma once

#include <functional>
#include <memory>

#include "comm/comm_engine.hpp"
#include "comm/communicator.hpp"

namespace mlptrain {

// An operation started by one call, when its channel allows, then tested.
class CallTask final : public EngineTask {
 public:
  CallTask(IssueChannel channel, std::function<std::unique_ptr<PendingOperation>()> start)
      : EngineTask(channel), start_(std::move(start)) {}
  TaskProgress advance(bool may_issue) override;

 private:
  std::function<std::unique_ptr<PendingOperation>()> start_;  // until started
  std::unique_ptr<PendingOperation> pending_;
};

// A started operation the engine runs. Dropped before it completed (an error on the way out),
// its task goes to the engine, which MPI may still need it from.
class EnginePending final : public PendingOperation {
 public:
  EnginePending(CommEngine& engine, std::unique_ptr<EngineTask> task) : engine_(engine), task_(std::move(task)) {}
  ~EnginePending() override;
  EnginePending(const EnginePending&) = delete;
  EnginePending& operator=(const EnginePending&) = delete;
  bool test() override { return engine_.test(*task_); }
  void wait() override { engine_.wait(*task_); }
  double completed_at_ms() const override { return task_->completed_at_ms(); }

 private:
  CommEngine& engine_;
  std::unique_ptr<EngineTask> task_;
};

}  // namespace mlptrain
