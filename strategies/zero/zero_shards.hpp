// What ZeRO's two paths (zero_gradients.hpp, zero_parameters.hpp) share: the unit layout of
// zero_units.hpp over this rank's store, the group each piece is sharded over (and, hybrid, summed
// across), and where this rank's shard of a piece sits: in the store's layout, in a unit buffer,
// in the shard buffers.
#pragma once

#include <cstddef>
#include <vector>

#include "strategies/registration.hpp"
#include "strategies/zero/zero_units.hpp"

namespace mlptrain {

void wait_all(std::vector<Request>& requests);
void test_all(std::vector<Request>& requests);

class ZeroShards {
 public:
  explicit ZeroShards(const StrategyContext& context);

  const ZeroLayout& layout() const { return layout_; }
  const std::vector<ZeroUnit>& units() const { return layout_.units; }
  // The unit of a local layer.
  std::size_t unit_of(int layer) const;
  // Whether unit `other` exists and runs right after (or before) `unit` in a pass: both in one
  // model chunk (the next chunk's pass is another action, maybe of another micro-batch).
  bool same_chunk(std::size_t unit, std::size_t other) const {
    return other < layout_.units.size() && local_.same_chunk(layout_.units[unit].layer, layout_.units[other].layer);
  }

  ParameterStore& store() const { return store_; }
  Kernels& kernels() const { return kernels_; }
  Allocator& allocator() const { return allocator_; }
  const Precision& precision() const { return precision_; }

  Communicator& group(const ZeroSegment& piece) const { return groups_.group(piece.group); }
  Communicator& replicas(const ZeroSegment& piece) const { return groups_.group(piece.across); }
  // Which copy of its shard of a piece this rank holds: under hybrid sharding each replica group
  // holds one (of piece.replicas).
  int replica_index(const ZeroSegment& piece) const { return piece.replicas == 1 ? 0 : replicas(piece).rank(); }
  // Zeroed memory from where the shard group of the data-parallel group runs collectives fastest
  // (an edp shard group's ranks are among its ranks): for the transient unit buffers.
  Buffer collective_buffer(MemoryState state, std::size_t bytes) const;
  // Re-homes the store's values or gradients the same way, for in-place collectives on them.
  void move_store_values_to_collective_memory() const;
  void move_store_grads_to_collective_memory() const;

  // Where this rank's shard of a piece starts: in the store's layout, and from the unit's start.
  std::size_t shard_start(const ZeroSegment& piece) const {
    return piece.range.offset + static_cast<std::size_t>(group(piece).rank()) * piece.shard_size;
  }
  std::size_t shard_in_unit(const ZeroUnit& unit, const ZeroSegment& piece) const {
    return shard_start(piece) - unit.full.offset;
  }
  // Element `element` of a buffer of parameters (param type) or gradients (reduce type).
  void* value_at(void* base, std::size_t element) const { return advance(base, element, precision_.param); }
  void* grad_at(void* base, std::size_t element) const { return advance(base, element, precision_.reduce); }

  // Starts one collective per piece shared over more than one rank, on the piece's place in a
  // unit buffer laid out as the store's (`start` gets the group, the piece and that place).
  template <typename Start>
  std::vector<Request> per_piece(const ZeroUnit& unit, Start start) const {
    std::vector<Request> requests;
    for (const ZeroSegment& piece : unit.segments)
      if (piece.ranks > 1) requests.push_back(start(group(piece), piece, piece.range.offset - unit.full.offset));
    return requests;
  }
  // Starts one all-reduce per piece held by more than one replica (hybrid sharding), on this
  // rank's reduced shard of it (`shard` gives where that is).
  template <typename Shard>
  std::vector<Request> sum_across_replicas(const ZeroUnit& unit, Shard shard) const {
    std::vector<Request> requests;
    for (const ZeroSegment& piece : unit.segments)
      if (piece.replicas > 1)
        requests.push_back(replicas(piece).all_reduce_async(shard(piece), piece.shard_size, precision_.reduce));
    return requests;
  }

 private:
  Communicator& collective_group() const;

  const ProcessGroups& groups_;
  Kernels& kernels_;
  Allocator& allocator_;
  ParameterStore& store_;
  const Precision precision_;
  const ZeroLayout layout_;
  const RankLayers local_;
};

}  // namespace mlptrain
