// Regrouping short slices before a checkpoint's writes (see checkpoint_exchange.hpp).
#include "io/checkpoint_exchange.hpp"

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"

namespace mlptrain {

namespace {

constexpr std::int64_t short_slice_elements = 65536;  // 256 KiB

// Rank `rank`'s domain of a tensor of `elements`: [begin, end).
std::pair<std::int64_t, std::int64_t> domain_of(std::int64_t elements, int rank, int ranks) {
  return {aligned_split(elements, rank, ranks), aligned_split(elements, rank + 1, ranks)};
}

int domain_rank(std::int64_t element, std::int64_t elements, int ranks) {
  int rank = 0;
  while (rank + 1 < ranks && domain_of(elements, rank + 1, ranks).first <= element) ++rank;
  return rank;
}

}  // namespace

RegroupPlan plan_regroup(const std::vector<WrittenSlice>& slices,
                         const std::vector<ParameterTensor>& global_tensors, Communicator& world) {
  // Per tensor: 1 where this rank's slices of it are short on average.
  std::vector<std::int64_t> count(global_tensors.size(), 0), elements(global_tensors.size(), 0);
  for (const WrittenSlice& slice : slices) {
    ++count[slice.tensor];
    elements[slice.tensor] += slice.count;
  }
  std::vector<std::int64_t> short_slices(global_tensors.size(), 0);
  for (std::size_t tensor = 0; tensor < global_tensors.size(); ++tensor)
    short_slices[tensor] = count[tensor] > 1 && elements[tensor] < count[tensor] * short_slice_elements ? 1 : 0;
  if (world.size() > 1) world.all_reduce(short_slices.data(), short_slices.size(), ReduceOp::max);
  RegroupPlan plan;
  for (const WrittenSlice& slice : slices) (short_slices[slice.tensor] ? plan.sent : plan.kept).push_back(slice);
  for (std::size_t tensor = 0; tensor < global_tensors.size(); ++tensor) {
    if (!short_slices[tensor]) continue;
    const auto [begin, end] = domain_of(static_cast<std::int64_t>(global_tensors[tensor].count), world.rank(), world.size());
    if (begin < end) plan.domains.push_back({.tensor = tensor, .offset = begin, .count = end - begin});
  }
  return plan;
}

void regroup(const RegroupPlan& plan, const std::vector<ParameterTensor>& global_tensors,
             const std::vector<float*>& domain_data, RegroupBuffers& buffers, Allocator& allocator,
             Communicator& world) {
  const auto ranks = static_cast<std::size_t>(world.size());
  // Each sent slice cut at the domains' boundaries: a piece (tensor, part, offset, count) to its
  // domain's rank. First the pieces and each rank's share, then the elements packed by rank.
  struct Piece {
    const WrittenSlice* slice;
    int part;
    std::size_t rank;
    std::int64_t offset, count;
  };
  std::vector<Piece> pieces;
  std::vector<std::vector<std::int64_t>> headers(ranks);
  std::vector<std::size_t> element_counts(ranks, 0);
  for (int part = 0; part < part_count; ++part)
    for (const WrittenSlice& slice : plan.sent) {
      const auto total = static_cast<std::int64_t>(global_tensors[slice.tensor].count);
      for (std::int64_t at = slice.offset; at < slice.offset + slice.count;) {
        const auto rank = static_cast<std::size_t>(domain_rank(at, total, world.size()));
        const std::int64_t end = std::min(slice.offset + slice.count, domain_of(total, static_cast<int>(rank), world.size()).second);
        pieces.push_back({&slice, part, rank, at, end - at});
        headers[rank].insert(headers[rank].end(), {static_cast<std::int64_t>(slice.tensor), part, at, end - at});
        element_counts[rank] += static_cast<std::size_t>(end - at);
        at = end;
      }
    }
  std::vector<std::size_t> element_starts(ranks, 0);
  for (std::size_t rank = 1; rank < ranks; ++rank) element_starts[rank] = element_starts[rank - 1] + element_counts[rank - 1];
  buffers.send.resize(element_starts.back() + element_counts.back());
  std::vector<float> host;  // a slice in device memory, copied
  for (const Piece& piece : pieces) {
    const float* data = slice_data(*piece.slice, piece.part) + (piece.offset - piece.slice->offset);
    float* into = buffers.send.data() + element_starts[piece.rank];
    allocator.copy_any_to_host(into, data, static_cast<std::size_t>(piece.count) * sizeof(float));
    element_starts[piece.rank] += static_cast<std::size_t>(piece.count);
  }
  // Counts first, then the headers and the elements, each one all-to-all.
  std::vector<std::int64_t> header_counts(ranks), counts_in(2 * ranks), counts_out(2 * ranks);
  std::vector<std::int64_t> header_send;
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    counts_out[2 * rank] = static_cast<std::int64_t>(headers[rank].size());
    counts_out[2 * rank + 1] = static_cast<std::int64_t>(element_counts[rank]);
    header_send.insert(header_send.end(), headers[rank].begin(), headers[rank].end());
  }
  world.all_to_all(counts_out.data(), counts_in.data(), 2);
  std::vector<std::size_t> headers_out(ranks), headers_in(ranks), elements_in(ranks);
  std::size_t header_total = 0, element_total = 0;
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    headers_out[rank] = headers[rank].size();
    headers_in[rank] = static_cast<std::size_t>(counts_in[2 * rank]);
    elements_in[rank] = static_cast<std::size_t>(counts_in[2 * rank + 1]);
    header_total += headers_in[rank];
    element_total += elements_in[rank];
  }
  std::vector<std::int64_t> received_headers(header_total);
  world.all_to_all_variable(header_send.data(), headers_out, received_headers.data(), headers_in);
  buffers.receive.resize(element_total);
  world.all_to_all_variable(buffers.send.data(), element_counts, buffers.receive.data(), elements_in);

  // Place each received piece in its domain, counting what each domain received: the pieces of
  // a tensor must cover it exactly once (a broken invariant otherwise, not a user error).
  std::vector<std::int64_t> filled(plan.domains.size() * part_count, 0);
  const float* from = buffers.receive.data();
  for (std::size_t at = 0; at + 3 < received_headers.size(); at += 4) {
    const auto tensor = static_cast<std::size_t>(received_headers[at]);
    const auto part = static_cast<std::size_t>(received_headers[at + 1]);
    const std::int64_t offset = received_headers[at + 2], count = received_headers[at + 3];
    const auto domain = std::find_if(plan.domains.begin(), plan.domains.end(),
                                     [&](const WrittenSlice& d) { return d.tensor == tensor; });
    const std::size_t index = part * plan.domains.size() + static_cast<std::size_t>(domain - plan.domains.begin());
    std::copy_n(from, count, domain_data[index] + (offset - domain->offset));
    filled[index] += count;
    from += count;
  }
  for (std::size_t index = 0; index < filled.size(); ++index)
    if (filled[index] != plan.domains[index % plan.domains.size()].count)
      throw RuntimeFailure("checkpoint: pieces of a tensor overlap or leave a gap");
}

}  // namespace mlptrain
