// Cutting a staged operation into pieces (see staging_plan.hpp).
#include "comm/staging_plan.hpp"

#include <algorithm>
#include <numeric>

namespace mlptrain {

namespace {

std::size_t pieces_for(std::size_t elements, std::size_t per_piece) {
  return std::max<std::size_t>((elements + per_piece - 1) / per_piece, 1);
}

// Elements of slice `piece` of a run of `elements`, `per_piece` a slice.
std::size_t slice(std::size_t elements, std::size_t piece, std::size_t per_piece) {
  const std::size_t first = piece * per_piece;
  return first >= elements ? 0 : std::min(per_piece, elements - first);
}

void add(std::vector<CopySpan>& spans, CopySpan span) {
  if (span.bytes > 0) spans.push_back(span);
}

bool block_kind(CommOp op) {
  return op == CommOp::reduce_scatter || op == CommOp::all_gather || op == CommOp::scatter ||
         op == CommOp::gather;
}

// Each rank's counts of an all-to-all (per rank: equal, or the variable ones).
std::vector<std::size_t> counts_of(const std::vector<std::size_t>& variable, std::size_t equal, int ranks) {
  return variable.empty() ? std::vector<std::size_t>(static_cast<std::size_t>(ranks), equal) : variable;
}

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> offsets(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::size_t{0});
  return offsets;
}

}  // namespace

StagingPlan::StagingPlan(const Operation& operation, int rank, int ranks, std::size_t chunk_bytes)
    : operation_(operation), rank_(rank), ranks_(ranks), element_(size_of(operation.type)) {
  const auto n = static_cast<std::size_t>(ranks);
  const bool per_rank = block_kind(operation.op) || operation.op == CommOp::all_to_all;
  chunk_elements_ = std::max<std::size_t>(chunk_bytes / element_ / (per_rank ? n : 1), 1);
  source_ = operation.op == CommOp::broadcast ? operation.receive : operation.send;
  destination_ = operation.receive;
  if (operation.op == CommOp::all_to_all) {
    const auto sent = counts_of(operation.send_counts, operation.count, ranks);
    const auto received = counts_of(operation.receive_counts, operation.count, ranks);
    received_at_ = std::accumulate(sent.begin(), sent.end(), std::size_t{0}) * element_;
    host_bytes_ = received_at_ + std::accumulate(received.begin(), received.end(), std::size_t{0}) * element_;
  } else {
    host_bytes_ = operation.count * element_ * (block_kind(operation.op) ? n : 1);
  }
}

std::vector<StagedPiece> StagingPlan::pieces(std::byte* host) const {
  std::vector<StagedPiece> pieces;
  if (operation_.op == CommOp::all_to_all) {
    exchange(pieces, host);
  } else if (block_kind(operation_.op)) {
    blocks(pieces, host);
  } else {
    contiguous(pieces, host);
  }
  return pieces;
}

void StagingPlan::contiguous(std::vector<StagedPiece>& pieces, std::byte* host) const {
  const CommOp op = operation_.op;
  const bool root = rank_ == operation_.peer;
  // Which side of a rooted or one-way operation moves data on this rank.
  const bool down = op == CommOp::all_reduce || op == CommOp::reduce || op == CommOp::send ||
                    (op == CommOp::broadcast && root);
  const bool up = op == CommOp::all_reduce || op == CommOp::recv || (op == CommOp::reduce && root) ||
                  (op == CommOp::broadcast && !root);
  const std::size_t count = pieces_for(operation_.count, chunk_elements_);
  for (std::size_t index = 0; index < count; ++index) {
    const std::size_t elements = slice(operation_.count, index, chunk_elements_);
    const std::size_t offset = index * chunk_elements_ * element_, bytes = elements * element_;
    StagedPiece piece;
    if (down) add(piece.down, {offset, offset, bytes});
    Operation part = operation_;
    part.count = elements;
    // In place on the host slice; a send has only a send side and a broadcast or recv a receive side.
    part.send = op == CommOp::broadcast || op == CommOp::recv ? nullptr : host + offset;
    part.receive = op == CommOp::send ? nullptr : host + offset;
    piece.operations.push_back(part);
    if (up) add(piece.up, {offset, offset, bytes});
    pieces.push_back(std::move(piece));
  }
}

void StagingPlan::blocks(std::vector<StagedPiece>& pieces, std::byte* host) const {
  const CommOp op = operation_.op;
  const auto n = static_cast<std::size_t>(ranks_), own = static_cast<std::size_t>(rank_);
  const bool root = rank_ == operation_.peer;
  const bool in_place = operation_.send == operation_.receive;
  const std::size_t block = operation_.count;
  // Reduce-scatter and scatter take every rank's block and leave one; gathers the reverse.
  const bool scatters = op == CommOp::reduce_scatter || op == CommOp::scatter;
  const bool all_down = op == CommOp::reduce_scatter || (op == CommOp::scatter && root);
  const bool all_up = op == CommOp::all_gather || (op == CommOp::gather && root);
  const std::size_t count = pieces_for(block, chunk_elements_);
  for (std::size_t index = 0; index < count; ++index) {
    const std::size_t first = index * chunk_elements_, elements = slice(block, index, chunk_elements_);
    const std::size_t at = first * n * element_, bytes = elements * element_;
    // Rank q's slice: in the device buffer of all ranks' blocks, and in the host piece.
    const auto device_block = [&](std::size_t q) { return (q * block + first) * element_; };
    const auto host_block = [&](std::size_t q) { return at + q * bytes; };
    // Where this rank's one block lies in its device buffer: its own block in place, else the start.
    const std::size_t own_device = ((in_place ? own * block : 0) + first) * element_;
    StagedPiece piece;
    for (std::size_t q = 0; q < n; ++q) {
      if (all_down) add(piece.down, {device_block(q), host_block(q), bytes});
      // A gather's input in place is already in the caller's own block: it need not come back.
      if (all_up && !(in_place && q == own)) add(piece.up, {device_block(q), host_block(q), bytes});
    }
    if (!scatters) add(piece.down, {own_device, host_block(own), bytes});
    // A scatter's root keeps its own block in place: only the others need theirs.
    if (scatters && !(op == CommOp::scatter && root && in_place)) add(piece.up, {own_device, host_block(own), bytes});
    Operation part = operation_;
    part.count = elements;
    part.send = part.receive = host + at;  // in place on the host piece
    piece.operations.push_back(part);
    pieces.push_back(std::move(piece));
  }
}

void StagingPlan::exchange(std::vector<StagedPiece>& pieces, std::byte* host) const {
  const auto sent = counts_of(operation_.send_counts, operation_.count, ranks_);
  const auto received = counts_of(operation_.receive_counts, operation_.count, ranks_);
  const auto sent_at = offsets_of(sent), received_at = offsets_of(received);
  const std::size_t longest = std::max(*std::max_element(sent.begin(), sent.end()),
                                       *std::max_element(received.begin(), received.end()));
  const std::size_t count = pieces_for(longest, chunk_elements_);
  for (std::size_t index = 0; index < count; ++index) {
    StagedPiece piece;
    const std::size_t first = index * chunk_elements_;
    const auto message = [&](CommOp op, std::size_t host_offset, std::size_t elements, int peer) {
      Operation part{.op = op, .count = elements, .type = operation_.type, .peer = peer, .tag = all_to_all_tag};
      if (op == CommOp::send) {
        part.send = host + host_offset;
      } else {
        part.receive = host + host_offset;
      }
      piece.operations.push_back(part);
    };
    // Receives posted before the sends of the same piece.
    for (int peer = 0; peer < ranks_; ++peer) {
      const auto q = static_cast<std::size_t>(peer);
      const std::size_t elements = slice(received[q], index, chunk_elements_);
      if (elements == 0) continue;
      const std::size_t offset = (received_at[q] + first) * element_;
      if (peer != rank_) message(CommOp::recv, received_at_ + offset, elements, peer);
      add(piece.up, {offset, received_at_ + offset, elements * element_});
    }
    for (int peer = 0; peer < ranks_; ++peer) {
      const auto q = static_cast<std::size_t>(peer);
      const std::size_t elements = slice(sent[q], index, chunk_elements_);
      if (elements == 0) continue;
      const std::size_t offset = (sent_at[q] + first) * element_;
      if (peer == rank_) {  // this rank's own block comes down where it is received
        add(piece.down, {offset, received_at_ + (received_at[q] + first) * element_, elements * element_});
        continue;
      }
      add(piece.down, {offset, offset, elements * element_});
      message(CommOp::send, offset, elements, peer);
    }
    pieces.push_back(std::move(piece));
  }
}

}  // namespace mlptrain
