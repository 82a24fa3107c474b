// Memory ledger bookkeeping (see memory_ledger.hpp).
#include "core/memory_ledger.hpp"

#include <algorithm>
#include <cassert>
#include <numeric>

namespace mlptrain {

std::string_view memory_state_name(MemoryState state) {
  switch (state) {
    case MemoryState::params: return "params";
    case MemoryState::grads: return "grads";
    case MemoryState::optimizer: return "optimizer";
    case MemoryState::activations: return "activations";
    case MemoryState::comm_buffers: return "comm_buffers";
    case MemoryState::workspace: return "workspace";
  }
  return "unknown";
}

void MemoryLedger::charge(MemoryState state, std::size_t bytes) {
  auto& held = current_[index(state)];
  held += static_cast<std::int64_t>(bytes);
  peak_[index(state)] = std::max(peak_[index(state)], held);
}

void MemoryLedger::release(MemoryState state, std::size_t bytes) {
  auto& held = current_[index(state)];
  held -= static_cast<std::int64_t>(bytes);
  assert(held >= 0);
}

std::int64_t MemoryLedger::current_total() const {
  return std::accumulate(current_.begin(), current_.end(), std::int64_t{0});
}

}  // namespace mlptrain
