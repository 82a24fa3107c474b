// Counter-based random numbers (Philox4x32-10). A stream is keyed by (seed, name) and the value at
// an index depends on nothing else, so any shard of a tensor or any slice of a dataset can be
// generated alone and equals the same slice of the whole: layouts start from the same model.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/counter_stream.hpp"

namespace mlptrain {

// 64-bit FNV-1a of a name, mixed with the seed (splitmix64).
std::uint64_t stream_key(std::uint64_t seed, std::string_view name);

class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::string_view name);

  // Uniform in (0, 1), never exactly 0 or 1.
  float uniform(std::uint64_t index) const;
  // Standard normal (Box-Muller on the index's own counter block; counter_stream::normal).
  float normal(std::uint64_t index) const;
  // A uniformly chosen integer in [0, bound).
  std::uint64_t below(std::uint64_t index, std::uint64_t bound) const;

  // Values for indices [first_index, first_index + count).
  void fill_uniform(float* out, std::uint64_t first_index, std::size_t count, float low,
                    float high) const;
  void fill_normal(float* out, std::uint64_t first_index, std::size_t count, float mean,
                   float stddev) const;

  // The stream's key, for generating the same values elsewhere (a device's kernels).
  counter_stream::Key key() const { return key_; }

 private:
  counter_stream::Key key_;
};

}  // namespace mlptrain
