// Predictions' state lookup (see prediction.hpp).
#include "cost/prediction.hpp"

#include <stdexcept>

namespace mlptrain {

StatePrediction& Prediction::state(MemoryState state) {
  return const_cast<StatePrediction&>(static_cast<const Prediction&>(*this).state(state));
}

const StatePrediction& Prediction::state(MemoryState state) const {
  switch (state) {
    case MemoryState::params: return params;
    case MemoryState::grads: return grads;
    case MemoryState::optimizer: return optimizer;
    case MemoryState::activations: return activations;
    default: throw std::logic_error("a prediction places parameters, gradients, optimizer state and activations");
  }
}

}  // namespace mlptrain
