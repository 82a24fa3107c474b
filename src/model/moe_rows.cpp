// An MoE layer's row moves (see moe_rows.hpp).
#include "model/moe_rows.hpp"

#include <numeric>

namespace mlptrain {

namespace {

std::vector<std::size_t> times(const std::vector<std::size_t>& rows, std::int64_t width) {
  std::vector<std::size_t> result;
  for (std::size_t count : rows) result.push_back(count * static_cast<std::size_t>(width));
  return result;
}

}  // namespace

Buffer MoeRowMoves::exchanged(Buffer rows, const std::vector<std::size_t>& rows_out, const std::vector<std::size_t>& rows_in,
                              std::int64_t width, DataType type, MemoryState state) const {
  if (exchange.expert_ranks() == 1) return rows;
  const auto total = static_cast<std::size_t>(std::accumulate(rows_in.begin(), rows_in.end(), std::size_t{0}));
  Buffer received = allocator.allocate_elements(state, total * static_cast<std::size_t>(width), type);
  exchange.exchange_rows(rows.as<void>(), times(rows_out, width), received.as<void>(), times(rows_in, width), type);
  return received;
}

Buffer MoeRowMoves::reordered(Buffer rows, const Buffer& order, std::int64_t width, DataType type,
                              MemoryState state) const {
  if (order.empty()) return rows;
  const auto count = static_cast<std::int64_t>(order.bytes() / sizeof(std::int32_t));
  Buffer result = allocator.allocate_elements(state, static_cast<std::size_t>(count * width), type);
  kernels.gather_rows(rows.as<void>(), order.as<std::int32_t>(), nullptr, result.as<void>(), count, width, type);
  return result;
}

float* MoeRowMoves::fp32_sums(DataType type, void* output, std::size_t count, Buffer& sums) const {
  if (type == DataType::float32) return static_cast<float*>(output);
  sums = allocator.allocate_floats(MemoryState::workspace, count);
  return sums.floats();
}

void MoeRowMoves::round_sums(const Buffer& sums, void* output, DataType type, std::size_t count) const {
  if (!sums.empty()) kernels.convert(sums.floats(), DataType::float32, output, type, count);
}

void MoeRowMoves::combine(const Buffer& source, DataType type, const MoeRouting& routing, const float* scales,
                          void* output, DataType output_type, std::int64_t tokens, std::int64_t width) const {
  const Buffer begin_table = upload(routing.token_row_begin, MemoryState::workspace);
  const Buffer rows_table = upload(routing.token_rows, MemoryState::workspace);
  kernels.sum_token_rows(source.as<void>(), type, begin_table.as<std::int32_t>(), rows_table.as<std::int32_t>(), scales,
                         output, output_type, tokens, width);
}

}  // namespace mlptrain
