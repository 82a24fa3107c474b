// Philox4x32-10 after Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC11).
#include "core/rng.hpp"

#include <cmath>

#include "core/vector_math.hpp"

namespace mlptrain {

namespace {
constexpr std::uint32_t philox_multiplier_0 = 0xD2511F53u;
constexpr std::uint32_t philox_multiplier_1 = 0xCD9E8D57u;
constexpr std::uint32_t philox_weyl_0 = 0x9E3779B9u;
constexpr std::uint32_t philox_weyl_1 = 0xBB67AE85u;

inline void philox_round(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2,
                         std::uint32_t& c3, std::uint32_t k0, std::uint32_t k1) {
  const std::uint64_t product_0 = static_cast<std::uint64_t>(philox_multiplier_0) * c0;
  const std::uint64_t product_1 = static_cast<std::uint64_t>(philox_multiplier_1) * c2;
  const std::uint32_t high_0 = static_cast<std::uint32_t>(product_0 >> 32);
  const std::uint32_t low_0 = static_cast<std::uint32_t>(product_0);
  const std::uint32_t high_1 = static_cast<std::uint32_t>(product_1 >> 32);
  const std::uint32_t low_1 = static_cast<std::uint32_t>(product_1);
  c0 = high_1 ^ c1 ^ k0;
  c1 = low_1;
  c2 = high_0 ^ c3 ^ k1;
  c3 = low_0;
}

// Philox on the counter (index, 0, 0, 0): the form every generator here uses, kept inline so
// that the fill loops vectorize.
inline void philox_index(std::uint64_t index, std::uint32_t k0, std::uint32_t k1,
                         std::uint32_t& w0, std::uint32_t& w1) {
  std::uint32_t c0 = static_cast<std::uint32_t>(index);
  std::uint32_t c1 = static_cast<std::uint32_t>(index >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += philox_weyl_0;
    k1 += philox_weyl_1;
  }
  w0 = c0;
  w1 = c1;
}

// 24 random bits mapped to the open interval (0, 1).
inline float open_unit(std::uint32_t word) {
  return (static_cast<float>(word >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

inline float box_muller(std::uint32_t w0, std::uint32_t w1) {
  const float radius = std::sqrt(-2.0f * vector_math::log(open_unit(w0)));
  float sine, cosine;
  vector_math::sincos_turns(open_unit(w1), sine, cosine);
  return radius * cosine;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key) {
  auto [c0, c1, c2, c3] = counter;
  auto [k0, k1] = key;
  for (int round = 0; round < 10; ++round) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += philox_weyl_0;
    k1 += philox_weyl_1;
  }
  return {c0, c1, c2, c3};
}

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
  std::uint32_t w0, w1;
  philox_index(index, key_[0], key_[1], w0, w1);
  return open_unit(w0);
}

float CounterRng::normal(std::uint64_t index) const {
  std::uint32_t w0, w1;
  philox_index(index, key_[0], key_[1], w0, w1);
  return box_muller(w0, w1);
}

std::uint64_t CounterRng::below(std::uint64_t index, std::uint64_t bound) const {
  std::uint32_t w0, w1;
  philox_index(index, key_[0], key_[1], w0, w1);
  const std::uint64_t word = (static_cast<std::uint64_t>(w1) << 32) | w0;
  // Multiply-shift keeps the bias below 2^-64 * bound, negligible for any dataset size.
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(word) * bound) >> 64);
}

void CounterRng::fill_uniform(float* out, std::uint64_t first_index, std::size_t count, float low,
                              float high) const {
  const float width = high - low;
  const std::uint32_t k0 = key_[0], k1 = key_[1];
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t w0, w1;
    philox_index(first_index + i, k0, k1, w0, w1);
    out[i] = low + width * open_unit(w0);
  }
}

void CounterRng::fill_normal(float* out, std::uint64_t first_index, std::size_t count, float mean,
                             float stddev) const {
  const std::uint32_t k0 = key_[0], k1 = key_[1];
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t w0, w1;
    philox_index(first_index + i, k0, k1, w0, w1);
    out[i] = mean + stddev * box_muller(w0, w1);
  }
}

}  // namespace mlptrain
