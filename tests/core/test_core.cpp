// Core room: memory ledger, caching allocator, counter RNG and the vectorizable math functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "core/memory_ledger.hpp"
#include "core/rng.hpp"
#include "core/vector_math.hpp"

using namespace mlptrain;

TEST(MemoryLedger, TracksCurrentAndPeakPerState) {
  MemoryLedger ledger;
  ledger.charge(MemoryState::params, 100);
  ledger.charge(MemoryState::activations, 50);
  ledger.charge(MemoryState::activations, 70);
  ledger.release(MemoryState::activations, 50);
  EXPECT_EQ(ledger.current(MemoryState::params), 100);
  EXPECT_EQ(ledger.current(MemoryState::activations), 70);
  EXPECT_EQ(ledger.peak(MemoryState::activations), 120);
  EXPECT_EQ(ledger.current_total(), 170);
  ledger.reset_peaks();
  EXPECT_EQ(ledger.peak(MemoryState::activations), 70);
}

TEST(HostAllocator, BuffersChargeTheirStateAndReuseBlocks) {
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  void* first_block = nullptr;
  {
    Buffer grads = allocator.allocate_floats(MemoryState::grads, 1000);
    EXPECT_EQ(ledger.current(MemoryState::grads), 4000);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(grads.floats()) % 64, 0u);
    first_block = grads.floats();
    Buffer moved = std::move(grads);
    EXPECT_TRUE(grads.empty());
    EXPECT_EQ(ledger.current(MemoryState::grads), 4000);
  }
  EXPECT_EQ(ledger.current(MemoryState::grads), 0);
  EXPECT_GT(allocator.cached_bytes(), 0u);
  Buffer again = allocator.allocate_floats(MemoryState::workspace, 1000);
  EXPECT_EQ(again.floats(), first_block);  // served from the cache
  EXPECT_EQ(ledger.peak(MemoryState::grads), 4000);
  EXPECT_TRUE(allocator.allocate(MemoryState::workspace, 0).empty());
}

TEST(HostAllocator, SizesThatVaryEveryStepShareAFewBlocks) {
  // An MoE layer's exchanged rows change with each step's routing: 400 to 650 rows of 1,024
  // floats here, 200 steps of different row counts. Blocks kept by size class serve the later
  // steps from the cache, a few blocks at most 1/8 larger than asked; kept by page, every new
  // row count made a new block, which the cache kept for ever.
  MemoryLedger ledger;
  HostAllocator allocator(ledger);
  std::size_t cache_halfway = 0;
  const std::size_t row_floats = 1024;
  for (std::size_t step = 0; step < 200; ++step) {
    const std::size_t rows = 400 + (step * 97) % 251;
    {
      Buffer exchanged = allocator.allocate_floats(MemoryState::workspace, rows * row_floats);
      exchanged.floats()[rows * row_floats - 1] = 1.0f;  // the whole request is usable
    }
    if (step == 99) cache_halfway = allocator.cached_bytes();
  }
  EXPECT_EQ(allocator.cached_bytes(), cache_halfway);  // nothing new in the last 100 steps
  const std::size_t largest_request = 650 * row_floats * sizeof(float);
  EXPECT_LE(allocator.cached_bytes(), 8 * largest_request);  // eight classes cover the range
  for (std::size_t bytes : {std::size_t{1}, std::size_t{65535}, std::size_t{65536}, std::size_t{1000000},
                            largest_request, std::size_t{3} << 30}) {
    EXPECT_GE(cached_block_bytes(bytes), bytes);
    EXPECT_LE(cached_block_bytes(bytes), bytes + std::max<std::size_t>(64, bytes / 8));
  }
}

TEST(Philox, MatchesTheRandom123KnownAnswer) {
  // Known-answer vector of Philox4x32-10 from the Random123 distribution (kat_vectors): counter
  // and key all zeros give 6627e8d5 e169c58d bc57ac4c 9b00dbd8, of which a stream takes two.
  const auto words = counter_stream::words({0, 0}, 0);
  EXPECT_EQ(words.first, 0x6627e8d5u);
  EXPECT_EQ(words.second, 0xe169c58du);
}

TEST(CounterRng, ValuesDependOnlyOnSeedNameAndIndex) {
  const CounterRng rng(7, "layers/00/weight");
  std::vector<float> whole(1000), slice(100);
  rng.fill_uniform(whole.data(), 0, whole.size(), -0.5f, 0.5f);
  rng.fill_uniform(slice.data(), 450, slice.size(), -0.5f, 0.5f);
  for (std::size_t i = 0; i < slice.size(); ++i) EXPECT_EQ(slice[i], whole[450 + i]);
  EXPECT_EQ(rng.uniform(3), CounterRng(7, "layers/00/weight").uniform(3));
  EXPECT_NE(rng.uniform(3), CounterRng(8, "layers/00/weight").uniform(3));
  EXPECT_NE(rng.uniform(3), CounterRng(7, "layers/00/bias").uniform(3));
}

TEST(CounterRng, UniformAndNormalHaveTheRightMoments) {
  const CounterRng rng(1, "moments");
  const std::size_t count = 200000;
  std::vector<float> uniform(count), normal(count);
  rng.fill_uniform(uniform.data(), 0, count, -1.0f, 3.0f);
  rng.fill_normal(normal.data(), 0, count, 2.0f, 0.5f);
  double u_sum = 0, n_sum = 0, n_square = 0;
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_GE(uniform[i], -1.0f);
    ASSERT_LE(uniform[i], 3.0f);
    u_sum += uniform[i];
    n_sum += normal[i];
    n_square += (normal[i] - 2.0) * (normal[i] - 2.0);
  }
  EXPECT_NEAR(u_sum / count, 1.0, 0.01);
  EXPECT_NEAR(n_sum / count, 2.0, 0.005);
  EXPECT_NEAR(std::sqrt(n_square / count), 0.5, 0.005);
  EXPECT_EQ(rng.normal(12345), [&] {
    float value;
    rng.fill_normal(&value, 12345, 1, 0.0f, 1.0f);
    return value;
  }());
}

TEST(CounterRng, BelowCoversTheRangeEvenly) {
  const CounterRng rng(3, "below");
  std::vector<int> counts(10, 0);
  for (std::uint64_t i = 0; i < 100000; ++i) counts[rng.below(i, 10)]++;
  for (int count : counts) EXPECT_NEAR(count, 10000, 500);
}

TEST(VectorMath, ExpMatchesLibm) {
  double worst = 0;
  for (float x = -80.0f; x < 80.0f; x += 0.0137f) {
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(vector_math::exp(x) - exact) / exact);
  }
  EXPECT_LT(worst, 3e-7);
}

// exp(-x^2/2) keeps its relative accuracy where x^2/2 is large: rounding x^2 first would cost
// up to 4e-6 of the result at |x| = 12 (half a float ulp of 144 / 2).
TEST(VectorMath, ExpMinusHalfSquareIsAccurateForLargeArguments) {
  double worst = 0;
  for (float x = 0.0f; x < 13.0f; x += 0.000917f) {
    const double exact = std::exp(-0.5 * static_cast<double>(x) * x);
    worst = std::max(worst, std::abs(vector_math::exp_minus_half_square(x) - exact) / exact);
  }
  EXPECT_LT(worst, 4e-7);
  // Below e^-87 it is 0 (no subnormals), for any argument up to the clamp.
  EXPECT_EQ(vector_math::exp_minus_half_square(16.0f), 0.0f);
}

TEST(VectorMath, LogMatchesLibm) {
  double worst = 0;
  for (float x = 1e-7f; x < 1.0f; x *= 1.0013f)
    worst = std::max(worst, std::abs(vector_math::log(x) - std::log(static_cast<double>(x))));
  EXPECT_LT(worst, 3e-6);
}

TEST(VectorMath, SinCosOfTurnsMatchLibm) {
  double worst = 0;
  for (float u = -2.0f; u < 2.0f; u += 0.000731f) {
    float sine, cosine;
    vector_math::sincos_turns(u, sine, cosine);
    const double angle = 2.0 * M_PI * static_cast<double>(u);
    worst = std::max({worst, std::abs(sine - std::sin(angle)), std::abs(cosine - std::cos(angle))});
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(VectorMath, NormalCdfIsAccurateInBothTails) {
  for (float x = -12.0f; x < 12.0f; x += 0.0093f) {
    const double exact = 0.5 * std::erfc(-static_cast<double>(x) / std::sqrt(2.0));
    const double got = vector_math::normal_cdf(x);
    // Relative accuracy everywhere, the far tails included, up to the conditioning of Phi at a
    // float argument (its relative condition number grows like x^2).
    EXPECT_LT(std::abs(got - exact) / exact, 5e-7 * (1.0 + x * x)) << "x = " << x;
  }
  // Far beyond the float range of the density: the limits (below the normal floats' 1.2e-38
  // for 0: no subnormals), never a NaN.
  EXPECT_LT(std::abs(vector_math::normal_cdf(-1e30f)), 1.2e-38f);
  EXPECT_EQ(vector_math::normal_cdf(1e30f), 1.0f);
  EXPECT_LT(std::abs(vector_math::normal_cdf_plus_x_pdf(-1e30f)), 1.2e-38f);
  EXPECT_EQ(vector_math::normal_cdf_plus_x_pdf(1e30f), 1.0f);
}

// GELU's derivative Phi(x) + x phi(x): accurate relative to its terms (they cancel near x =
// -0.75), and in the far tail, where both are tiny, relative to itself.
TEST(VectorMath, NormalCdfPlusXPdfMatchesLibm) {
  for (float x = -12.0f; x < 12.0f; x += 0.0071f) {
    const double cdf = 0.5 * std::erfc(-static_cast<double>(x) / std::sqrt(2.0));
    const double x_pdf = x * std::exp(-0.5 * static_cast<double>(x) * x) / std::sqrt(2.0 * M_PI);
    const double got = vector_math::normal_cdf_plus_x_pdf(x);
    EXPECT_LE(std::abs(got - (cdf + x_pdf)), 5e-7 * (1.0 + x * x) * (cdf + std::abs(x_pdf))) << "x = " << x;
  }
}
