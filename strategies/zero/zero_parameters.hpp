// ZeRO's parameter path: where a unit's parameters are when a layer uses them. Two ways:
//   held (stages 1 and 2): every rank holds all its layers' values; after the optimizer step
//       each unit's updated shards are all-gathered in place, overlapping the next forward, which
//       waits for a unit's gather before using it.
//   gathered per use (stage 3): parameters live only as shards; a unit is gathered before its
//       forward (and again before its backward, and before a recomputed forward) into one of two
//       slots (with --fp8 tensorwise a dense layer's weight as fp8 bytes, decoded there), the next unit's gather prefetched while the current one computes, and released
//       right after use. In backward the slot also takes the unit's gradients, lent to the
//       gradient path: over the parameters themselves when the param and reduce types agree (W's
//       last use comes first), else after them; a slot is reused only once the reductions
//       reading it are over.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "strategies/zero/zero_gradients.hpp"
#include "strategies/zero/zero_shards.hpp"

namespace mlptrain {

class ZeroParameterPath {
 public:
  virtual ~ZeroParameterPath() = default;

  // Where a unit's forward reads its parameters (null: the store's own).
  virtual void* begin_forward(std::size_t unit, bool recomputing) = 0;
  virtual void end_forward(std::size_t unit) = 0;
  // Where a unit's backward reads its parameters (null: the store's own) and a buffer it lends
  // for the unit's gradients (null: none).
  struct BackwardBuffers {
    void* values = nullptr;
    void* lent_grads = nullptr;
  };
  virtual BackwardBuffers begin_backward(std::size_t unit) = 0;
  virtual void end_backward(std::size_t unit) = 0;
  // A buffer it lends for a unit's gradients alone (a split backward's W; null: none).
  virtual void* lend_grads() = 0;
  // After the optimizer updated this rank's shards.
  virtual void after_update() = 0;
  virtual void progress() = 0;
  // The values the optimizer updates for this rank's shard element (as in ZeroGradientPath).
  virtual void* shard_values(std::size_t store_element, std::size_t in_shard) const = 0;
  // Whether the rank holds only its shards (else every value of its layers).
  virtual bool holds_only_shards() const = 0;
};

class ParametersHeld final : public ZeroParameterPath {
 public:
  explicit ParametersHeld(const ZeroShards& shards);
  void* begin_forward(std::size_t unit, bool recomputing) override;
  void end_forward(std::size_t) override {}
  BackwardBuffers begin_backward(std::size_t) override { return {}; }
  void end_backward(std::size_t) override {}
  void* lend_grads() override { return nullptr; }
  void after_update() override;
  void progress() override;
  void* shard_values(std::size_t store_element, std::size_t) const override;
  bool holds_only_shards() const override { return false; }

 private:
  const ZeroShards& shards_;
  std::vector<std::vector<Request>> gathers_;  // per unit
};

class ParametersGatheredPerUse final : public ZeroParameterPath {
 public:
  // `gradients` finishes the reductions that read a slot before the slot is reused.
  ParametersGatheredPerUse(const ZeroShards& shards, ZeroGradientPath& gradients);
  // The slots outlive the reductions reading them (not while unwinding from an error, when
  // waiting on other ranks could hang).
  ~ParametersGatheredPerUse() override;
  void* begin_forward(std::size_t unit, bool recomputing) override;
  void end_forward(std::size_t unit) override { gathered_.erase(unit); }
  BackwardBuffers begin_backward(std::size_t unit) override;
  void end_backward(std::size_t unit) override { gathered_.erase(unit); }
  void* lend_grads() override { return slot_grads(free_slot()); }
  void after_update() override {}
  void progress() override;
  void* shard_values(std::size_t, std::size_t in_shard) const override;
  bool holds_only_shards() const override { return true; }

 private:
  struct Gathered {
    std::size_t slot = 0;
    std::vector<Request> requests;
    Buffer fp8_wire;  // a unit gathered in fp8: every rank's block, decoded into the slot once here,
    Buffer fp8_amax;  // and the weight's amax its scale comes from
  };
  // The slot holding the unit's gathered parameters (gathering now if no prefetch started it).
  std::size_t gathered(std::size_t unit);
  void prefetch(std::size_t unit);
  // --fp8 (zero_units.hpp's Fp8Wire): this rank's block of a unit encoded from its shard and the
  // gather started; each block decoded into the slot once it arrived.
  Gathered gather_in_fp8(const ZeroUnit& unit, std::size_t slot);
  void decode_fp8(const ZeroUnit& unit, const Gathered& entry);
  std::size_t free_slot();
  void* slot_values(std::size_t slot) const { return slot_pool_.as<char>() + slot * slot_bytes_; }
  void* slot_grads(std::size_t slot) const { return static_cast<char*>(slot_values(slot)) + slot_grads_at_; }

  const ZeroShards& shards_;
  ZeroGradientPath& gradients_;
  Buffer shard_values_;
  Buffer slot_pool_;               // two gathered units (and their gradients in backward)
  std::size_t slot_bytes_ = 0;     // a slot...
  std::size_t slot_grads_at_ = 0;  // ...and where its gradients start in it
  std::map<std::size_t, Gathered> gathered_;
};

std::unique_ptr<ZeroParameterPath> make_parameter_path(const ZeroShards& shards, int stage,
                                                       ZeroGradientPath& gradients);

}  // namespace mlptrain
