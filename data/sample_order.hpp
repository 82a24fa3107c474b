// Which samples a step reads (DESIGN.md §2.2): step s consumes global positions [s*B, s*B + B),
// taken modulo the dataset size, in order or through a seeded permutation per epoch. Micro-batch j
// is the j-th contiguous slice of the global batch and data-parallel rank r the r-th contiguous
// slice of each micro-batch, so every layout with the same B and M sees the same global
// micro-batches.
#pragma once

#include <cstdint>
#include <vector>

namespace mlptrain {

struct BatchLayout {
  std::int64_t global_batch = 1;
  int micro_batches = 1;
  int data_parallel = 1;
  // A run resumed at step `resumed_step` continues from the data position its checkpoint stored,
  // whatever global batch wrote it.
  std::int64_t resumed_step = 0;
  std::int64_t resumed_position = 0;

  std::int64_t micro_batch_size() const { return global_batch / micro_batches; }
  std::int64_t local_size() const { return micro_batch_size() / data_parallel; }
  // Global position of the first sample of a step (also: the samples consumed before it).
  std::int64_t step_position(std::int64_t step) const {
    return resumed_position + (step - resumed_step) * global_batch;
  }
  // Global position of the first sample of (step, micro-batch, data-parallel rank).
  std::int64_t first_position(std::int64_t step, int micro_batch, int data_rank) const {
    return step_position(step) + micro_batch * micro_batch_size() + data_rank * local_size();
  }
};

class SampleOrder {
 public:
  SampleOrder(std::int64_t dataset_size, bool shuffle, std::uint64_t seed);

  std::int64_t sample_at(std::int64_t position);
  // Sample indices of `count` consecutive positions starting at `first`.
  std::vector<std::int64_t> samples(std::int64_t first, std::int64_t count);

 private:
  void build_permutation(std::int64_t epoch);

  std::int64_t dataset_size_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> permutation_;
};

}  // namespace mlptrain
