// The communicators' engine tasks (see engine_tasks.hpp).
#include "comm/engine_tasks.hpp"

#include <utility>

namespace mlptrain {

TaskProgress CallTask::advance(bool may_issue) {
  bool moved = false;
  if (start_) {
    if (!may_issue) return {.issued_all = false};
    pending_ = std::exchange(start_, nullptr)();
    moved = true;
  }
  const bool complete = pending_->test();
  return {.moved = moved || complete, .complete = complete};
}

EnginePending::~EnginePending() {
  if (!task_->complete()) engine_.keep(std::move(task_));
}

}  // namespace mlptrain
