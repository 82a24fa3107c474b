// Sample order (see sample_order.hpp). The permutation of an epoch is a Fisher-Yates shuffle
// driven by the counter RNG keyed by (seed, "shuffle/<epoch>"), so it is a pure function of the
// seed and the epoch and a resumed run finds the same order.
#include "data/sample_order.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "core/rng.hpp"

namespace mlptrain {

SampleOrder::SampleOrder(std::int64_t dataset_size, bool shuffle, std::uint64_t seed)
    : dataset_size_(dataset_size), shuffle_(shuffle), seed_(seed) {}

std::int64_t SampleOrder::sample_at(std::int64_t position) {
  const std::int64_t epoch = position / dataset_size_;
  const std::int64_t offset = position % dataset_size_;
  if (!shuffle_) return offset;
  if (epoch != cached_epoch_) build_permutation(epoch);
  return permutation_[static_cast<std::size_t>(offset)];
}

std::vector<std::int64_t> SampleOrder::samples(std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> indices(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) indices[static_cast<std::size_t>(i)] = sample_at(first + i);
  return indices;
}

void SampleOrder::build_permutation(std::int64_t epoch) {
  permutation_.resize(static_cast<std::size_t>(dataset_size_));
  std::iota(permutation_.begin(), permutation_.end(), std::int64_t{0});
  const CounterRng rng(seed_, "shuffle/" + std::to_string(epoch));
  for (std::int64_t i = dataset_size_ - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(
        rng.below(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1)));
    std::swap(permutation_[static_cast<std::size_t>(i)], permutation_[static_cast<std::size_t>(j)]);
  }
  cached_epoch_ = epoch;
}

}  // namespace mlptrain
