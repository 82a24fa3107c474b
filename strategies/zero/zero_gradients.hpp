// ZeRO's gradient path: how a unit's gradients reach the shard of the rank that updates them.
// Two ways, one per memory budget:
//   reduced once (stage 1): full gradients accumulate in the store over the micro-batches; after
//       a unit's last one, they are reduce-scattered in place (each rank's own block gets the sum).
//   reduced every micro-batch (stages 2 and 3): each micro-batch's unit gradients are written
//       (not accumulated) into a transient unit buffer that is reduce-scattered at once and added
//       into the shard accumulator, so full gradients never outlive a unit's backward. The
//       buffers come from a pool of their own (two rotate, one reducing while the next unit
//       computes) or are lent by the parameter path (stage 3: its gathered unit's slot).
// Under hybrid sharding each reduced shard is then summed across its replicas once a step: in
// stage 1 as soon as the unit's reduce-scatter is done, in stages 2-3 once the unit's last
// micro-batch is added into the accumulator. Those all-reduces start in the units' order, which
// is the same on every rank, so the replica group's collectives match.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "strategies/zero/zero_shards.hpp"

namespace mlptrain {

class ZeroGradientPath {
 public:
  virtual ~ZeroGradientPath() = default;

  // Before a unit's backward for one micro-batch: where the layer writes the unit's gradients
  // (null: the store's own, accumulated). `lent` is a unit buffer lent for them, or null.
  virtual void* begin_backward(std::size_t unit, int micro_batch, void* lent) = 0;
  // After it: starts whatever reduction is due.
  virtual void end_backward(std::size_t unit, bool last_micro_batch) = 0;
  // Every reduction of the step finished: each shard holds its sum over the micro-batches.
  virtual void finish_step() = 0;
  // Started operations are tested between layers: where the communication engine has no thread
  // of its own, they move only then.
  virtual void progress() = 0;
  // Whether a reduction still reads `buffer` (a lent one), and finishing those that do.
  virtual bool reading(const void* buffer) const = 0;
  virtual void release(const void* buffer) = 0;
  // The gradients the optimizer reads for this rank's shard element: `store_element` in the
  // store's layout, `in_shard` in the shard buffers.
  virtual void* shard_grads(std::size_t store_element, std::size_t in_shard) const = 0;
};

class GradientsReducedOnce final : public ZeroGradientPath {
 public:
  explicit GradientsReducedOnce(const ZeroShards& shards);
  void* begin_backward(std::size_t, int, void*) override { return nullptr; }
  void end_backward(std::size_t unit, bool last_micro_batch) override;
  void finish_step() override;
  void progress() override;
  bool reading(const void*) const override { return false; }
  void release(const void*) override {}
  void* shard_grads(std::size_t store_element, std::size_t) const override;

 private:
  // Starts the sums across replicas of the units whose reduce-scatter is done, in order (all of
  // them, waiting, when `wait`).
  void start_sums_across(bool wait);

  const ZeroShards& shards_;
  std::vector<std::vector<Request>> reductions_;  // per unit
  std::deque<std::size_t> reducing_;              // units reduce-scattered, not yet summed across
  std::vector<Request> summing_across_;
};

class GradientsReducedEveryMicroBatch final : public ZeroGradientPath {
 public:
  // `own_buffers`: unit buffers of its own (0: every buffer is lent).
  GradientsReducedEveryMicroBatch(const ZeroShards& shards, std::size_t own_buffers);
  void* begin_backward(std::size_t unit, int micro_batch, void* lent) override;
  void end_backward(std::size_t unit, bool last_micro_batch) override;
  void finish_step() override;
  void progress() override;
  bool reading(const void* buffer) const override;
  void release(const void* buffer) override;
  void* shard_grads(std::size_t store_element, std::size_t in_shard) const override;

 private:
  // A unit's full gradients of one micro-batch, being reduce-scattered.
  struct Reducing {
    std::size_t unit = 0;
    int micro_batch = 0;
    bool last_micro_batch = false;
    void* buffer = nullptr;
    std::vector<Request> requests;  // one per piece shared over more than one rank
  };
  void* take_own_buffer();
  void finish_oldest();

  const ZeroShards& shards_;
  Buffer shard_grads_;  // the shard accumulator
  Buffer own_pool_;
  std::size_t own_buffers_ = 0;
  std::size_t next_own_buffer_ = 0;
  std::deque<Reducing> reducing_;  // oldest first
  std::vector<Request> summing_across_;
};

std::unique_ptr<ZeroGradientPath> make_gradient_path(const ZeroShards& shards, int stage);

}  // namespace mlptrain
