// Schedule generation (see schedule.hpp).
#include "train/schedule.hpp"

namespace mlptrain {

std::vector<Action> sequential_schedule(int micro_batches) {
  std::vector<Action> actions;
  for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch) {
    actions.push_back({ActionKind::forward, micro_batch});
    actions.push_back({ActionKind::backward, micro_batch});
  }
  return actions;
}

}  // namespace mlptrain
