// How an MoE layer reaches other ranks: the statistics of its global micro-batch gathered over
// the data-parallel group, and rows moved to and from the ranks that hold its experts. Expert
// parallelism implements it; one process is its own exchange.
#pragma once

#include <cstddef>
#include <vector>

#include "core/data_type.hpp"

namespace mlptrain {

// How an MoE layer meets the rest of its global micro-batch and its experts.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // The data-parallel group (one global micro-batch) and the expert-parallel group inside it:
  // expert rank j of this rank's EP group is data rank (data_rank() - expert_rank() + j), and
  // holds experts [j E / X, (j + 1) E / X).
  virtual int data_ranks() const = 0;
  virtual int data_rank() const = 0;
  virtual int expert_ranks() const = 0;
  virtual int expert_rank() const = 0;
  // Every data rank's `count` values, in rank order: `all` holds data_ranks() x count.
  virtual void gather_statistics(const double* local, double* all, std::size_t count) = 0;
  // Rows to the EP group: `send` packed by destination rank, `receive` by source rank (elements
  // of `type` per rank given). Only called when there is more than one expert rank.
  virtual void exchange_rows(const void* send, const std::vector<std::size_t>& send_elements, void* receive,
                             const std::vector<std::size_t>& receive_elements, DataType type) = 0;
  // The tensor-parallel group, whose ranks hold the same tokens and split each expert-parallel
  // rank's experts among them (tensor rank t the t-th equal part): the probabilities' gradients
  // each computed from its own experts are summed over it.
  virtual int tensor_ranks() const { return 1; }
  virtual int tensor_rank() const { return 0; }
  virtual void sum_over_tensor_group(float* /*data*/, std::size_t /*count*/) {}
};

// One process: its micro-batch is the global one, and it holds every expert.
class SingleProcessExchange final : public ExpertExchange {
 public:
  int data_ranks() const override { return 1; }
  int data_rank() const override { return 0; }
  int expert_ranks() const override { return 1; }
  int expert_rank() const override { return 0; }
  void gather_statistics(const double* local, double* all, std::size_t count) override;
  void exchange_rows(const void* send, const std::vector<std::size_t>& send_elements, void* receive,
                     const std::vector<std::size_t>& receive_elements, DataType type) override;
};

}  // namespace mlptrain
