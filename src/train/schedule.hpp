// A step's work as data: the ordered actions one rank executes. Without a pipeline, each
// micro-batch's forward is followed at once by its backward, so one micro-batch of activations is
// alive at a time.
#pragma once

#include <vector>

namespace mlptrain {

enum class ActionKind { forward, backward };

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = 0;
  bool operator==(const Action&) const = default;
};

std::vector<Action> sequential_schedule(int micro_batches);

}  // namespace mlptrain
