// A step's world sums (see step_totals.hpp).
#include "train/step_totals.hpp"

#include <cmath>

namespace mlptrain {

void StepTotals::sum_over(Communicator& world) {
  if (world.size() == 1) return;
  std::vector<double> values = {loss_sum,     correct,           grad_square_sum, read_problems,
                                data_wait_ms, checkpoint_writers, stop_requests};
  if (!expert_load.empty()) values.insert(values.end(), {aux_loss, dropped});
  for (const std::vector<double>& layer : expert_load) values.insert(values.end(), layer.begin(), layer.end());
  world.all_reduce(values.data(), values.size());
  auto next = values.begin();
  for (double* total :
       {&loss_sum, &correct, &grad_square_sum, &read_problems, &data_wait_ms, &checkpoint_writers, &stop_requests})
    *total = *next++;
  if (!expert_load.empty()) {
    aux_loss = *next++;
    dropped = *next++;
  }
  for (std::vector<double>& layer : expert_load)
    for (double& load : layer) load = *next++;
}

bool StepTotals::finite() const { return std::isfinite(loss_sum) && std::isfinite(grad_square_sum); }

}  // namespace mlptrain
