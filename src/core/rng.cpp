// Counter-based random numbers on Random123's Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC11), through the arithmetic the device shares
// (core/counter_stream.hpp).
#include "core/rng.hpp"

#include <cmath>

#include "core/counter_stream.hpp"

namespace mlptrain {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t stream_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char character : name) {
    hash ^= character;
    hash *= 0x100000001b3ull;
  }
  return splitmix64(hash ^ splitmix64(seed));
}

CounterRng::CounterRng(std::uint64_t seed, std::string_view name) {
  const std::uint64_t key = stream_key(seed, name);
  key_ = {static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)};
}

float CounterRng::uniform(std::uint64_t index) const {
  return counter_stream::open_unit(counter_stream::words(key(), index).first);
}

float CounterRng::normal(std::uint64_t index) const {
  return counter_stream::normal(counter_stream::words(key(), index));
}

std::uint64_t CounterRng::below(std::uint64_t index, std::uint64_t bound) const {
  return counter_stream::below(counter_stream::words(key(), index), bound);
}

void CounterRng::fill_uniform(float* out, std::uint64_t first_index, std::size_t count, float low,
                              float high) const {
  const float width = high - low;
  const counter_stream::Key stream = key();
  for (std::size_t i = 0; i < count; ++i)
    out[i] = counter_stream::fused(width, counter_stream::open_unit(counter_stream::words(stream, first_index + i).first), low);
}

void CounterRng::fill_normal(float* out, std::uint64_t first_index, std::size_t count, float mean,
                             float stddev) const {
  const counter_stream::Key stream = key();
  for (std::size_t i = 0; i < count; ++i)
    out[i] = counter_stream::fused(stddev, counter_stream::normal(counter_stream::words(stream, first_index + i)), mean);
}

}  // namespace mlptrain
