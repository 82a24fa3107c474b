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
    case MemoryState::comm_buffers: return comm_buffers;
    default:
      throw std::logic_error(
          "a prediction places parameters, gradients, optimizer state, activations and communication buffers");
  }
}

std::int64_t Prediction::comm(CommOp op) const {
  std::int64_t bytes = 0;
  for (const auto& by_op : comm_by_group) bytes += by_op[static_cast<int>(op)];
  return bytes;
}

}  // namespace mlptrain
