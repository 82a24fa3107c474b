// Wall-clock time in milliseconds from a monotonic clock.
#pragma once

#include <chrono>

namespace mlptrain {

inline double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

}  // namespace mlptrain
