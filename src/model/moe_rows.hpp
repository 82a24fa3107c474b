// How an MoE layer's passes move rows: to and from the ranks of the experts (packed by
// destination, received by source), reordered by a table, and summed into their tokens' rows (in
// fp32, rounded once); and the routing's host tables copied to the kernels' memory.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/expert_exchange.hpp"
#include "model/moe_routing.hpp"

namespace mlptrain {

struct MoeRowMoves {
  Kernels& kernels;
  Allocator& allocator;
  ExpertExchange& exchange;

  // Rows of `type` in packed order sent to the other side of the exchange, `rows_out` and
  // `rows_in` rows per rank; with one expert rank the rows stay.
  Buffer exchanged(Buffer rows, const std::vector<std::size_t>& rows_out, const std::vector<std::size_t>& rows_in,
                   std::int64_t width, DataType type, MemoryState state) const;
  // Rows reordered by `order` (int32, destination row i = source row order[i]); none needed when
  // empty.
  Buffer reordered(Buffer rows, const Buffer& order, std::int64_t width, DataType type, MemoryState state) const;
  // Where the fp32 sums of rows bound for `output` (of `type`) are formed: the output itself when
  // it is fp32, else a workspace buffer (`sums`) that round_sums rounds once into the output.
  float* fp32_sums(DataType type, void* output, std::size_t count, Buffer& sums) const;
  void round_sums(const Buffer& sums, void* output, DataType type, std::size_t count) const;
  // output [tokens, width] (of `output_type`) = the sum over each token's kept assignments of
  // scale x source row, in fp32, rounded once, the rows taken from the routing's per-token lists.
  void combine(const Buffer& source, DataType type, const MoeRouting& routing, const float* scales, void* output,
               DataType output_type, std::int64_t tokens, std::int64_t width) const;

  template <typename T>
  Buffer upload(const std::vector<T>& values, MemoryState state = MemoryState::activations) const {
    Buffer buffer = allocator.allocate(state, values.size() * sizeof(T));
    allocator.copy_to_device(buffer.as<void>(), values.data(), buffer.bytes());
    return buffer;
  }
};

}  // namespace mlptrain
