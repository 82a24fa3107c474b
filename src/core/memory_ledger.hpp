// The memory ledger: every byte a rank allocates for training is charged to one state, so that
// reports and tests read what was actually held instead of estimating it. Current and peak bytes
// are kept per state; the peak of a state is the largest amount of that state held at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mlptrain {

enum class MemoryState : int { params, grads, optimizer, activations, comm_buffers, workspace };

inline constexpr int memory_state_count = 6;
inline constexpr std::array<MemoryState, memory_state_count> all_memory_states = {
    MemoryState::params,      MemoryState::grads,        MemoryState::optimizer,
    MemoryState::activations, MemoryState::comm_buffers, MemoryState::workspace};

std::string_view memory_state_name(MemoryState state);

using MemoryByState = std::array<std::int64_t, memory_state_count>;

class MemoryLedger {
 public:
  void charge(MemoryState state, std::size_t bytes);
  void release(MemoryState state, std::size_t bytes);

  std::int64_t current(MemoryState state) const { return current_[index(state)]; }
  std::int64_t peak(MemoryState state) const { return peak_[index(state)]; }
  const MemoryByState& current() const { return current_; }
  const MemoryByState& peak() const { return peak_; }
  std::int64_t current_total() const;
  // Starts a new peak window (peaks restart from the current holdings).
  void reset_peaks() { peak_ = current_; }

 private:
  static int index(MemoryState state) { return static_cast<int>(state); }
  MemoryByState current_{};
  MemoryByState peak_{};
};

}  // namespace mlptrain
