// How host staging cuts operations into pieces (no MPI, no device): for every operation, rank
// count, root and chunk size, the copies down read exactly what the rank sends, once each, the
// copies up write exactly what it receives, once each, all inside the buffers; each piece's MPI
// operations stay inside the host buffers and carry about a chunk; and the pieces of a
// collective have the same count and sizes on every rank (so their MPI calls match).
// The MPI suite (test_host_staging.cpp) holds the results to those of host memory.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "comm/staging_plan.hpp"

using namespace mlptrain;

namespace {

constexpr std::size_t element = 4;  // fp32

struct Case {
  CommOp op;
  bool in_place;
  std::size_t count;  // Operation's count
};

// What the rank's device buffers hold, as the operation's contract says (communicator.hpp).
struct Sides {
  std::size_t source_bytes;        // the buffer copies down read
  std::size_t destination_bytes;   // the buffer copies up write
  std::size_t sent;                // bytes that must come down, once each
  std::size_t received;            // bytes that must go up, once each
};

Sides sides(const Operation& operation, int rank, int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  const bool root = rank == operation.peer, in_place = operation.send == operation.receive;
  const std::size_t one = operation.count * element, all = one * n;
  switch (operation.op) {
    case CommOp::all_reduce: return {one, one, one, one};
    case CommOp::reduce: return {one, one, one, root ? one : 0};
    case CommOp::broadcast: return {one, one, root ? one : 0, root ? 0 : one};
    case CommOp::send: return {one, 0, one, 0};
    case CommOp::recv: return {0, one, 0, one};
    case CommOp::reduce_scatter: return {all, in_place ? all : one, all, one};
    case CommOp::scatter: return {all, in_place ? all : one, root ? all : 0, (in_place && root) ? 0 : one};
    case CommOp::all_gather: return {in_place ? all : one, all, one, in_place ? all - one : all};
    case CommOp::gather:
      return {in_place ? all : one, all, one, root ? (in_place ? all - one : all) : 0};
    case CommOp::all_to_all: {
      const std::size_t sent = std::accumulate(operation.send_counts.begin(), operation.send_counts.end(), std::size_t{0});
      const std::size_t received =
          std::accumulate(operation.receive_counts.begin(), operation.receive_counts.end(), std::size_t{0});
      return {sent * element, received * element, sent * element, received * element};
    }
  }
  return {};
}

// Marks [offset, offset + bytes) in `seen`; false if any byte was already marked or out of range.
bool mark(std::vector<int>& seen, std::size_t offset, std::size_t bytes) {
  if (offset + bytes > seen.size()) return false;
  for (std::size_t at = offset; at < offset + bytes; ++at)
    if (seen[at]++ > 0) return false;
  return true;
}

std::size_t marked(const std::vector<int>& seen) {
  return static_cast<std::size_t>(std::count(seen.begin(), seen.end(), 1));
}

// The shape of a rank's pieces that the other ranks' must match: per piece, its collective's
// count (point-to-point pieces are matched message by message instead).
std::vector<std::size_t> shape(const std::vector<StagedPiece>& pieces) {
  std::vector<std::size_t> counts;
  for (const StagedPiece& piece : pieces)
    for (const Operation& operation : piece.operations)
      if (operation.op != CommOp::send && operation.op != CommOp::recv) counts.push_back(operation.count);
  return counts;
}

}  // namespace

TEST(StagingPlan, PiecesMoveEachByteOnceAndStayInTheirBuffers) {
  const std::vector<Case> cases = {
      {CommOp::all_reduce, true, 1000}, {CommOp::all_reduce, false, 1000}, {CommOp::reduce, true, 333},
      {CommOp::broadcast, true, 777},   {CommOp::send, false, 500},         {CommOp::recv, false, 500},
      {CommOp::reduce_scatter, true, 301}, {CommOp::reduce_scatter, false, 64}, {CommOp::scatter, true, 129},
      {CommOp::scatter, false, 50},     {CommOp::all_gather, true, 301},    {CommOp::all_gather, false, 7},
      {CommOp::gather, true, 90},       {CommOp::gather, false, 90},        {CommOp::all_to_all, false, 100},
      {CommOp::all_reduce, true, 0},    {CommOp::send, false, 0}};
  for (const Case& test : cases)
    for (int ranks : {1, 2, 3, 4})
      for (std::size_t chunk_bytes : {std::size_t{64}, std::size_t{1000}, std::size_t{1} << 20}) {
        std::map<int, std::vector<std::size_t>> shapes;
        for (int rank = 0; rank < ranks; ++rank) {
          const std::string label = std::string(comm_op_name(test.op)) + (test.in_place ? " in place" : "") +
                                    ", rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                                    ", chunk " + std::to_string(chunk_bytes);
          SCOPED_TRACE(label);
          // Device buffers are stand-ins: only offsets matter.
          static std::byte device_send[1], device_receive[1];
          Operation operation{.op = test.op, .count = test.count, .peer = ranks - 1};
          operation.send = device_send;
          operation.receive = test.in_place ? device_send : device_receive;
          if (test.op == CommOp::all_to_all) {  // uneven, as MoE rows are: rank r sends r + d + 1 rows to d
            for (int peer = 0; peer < ranks; ++peer) {
              operation.send_counts.push_back(test.count * static_cast<std::size_t>(rank + peer + 1));
              operation.receive_counts.push_back(test.count * static_cast<std::size_t>(peer + rank + 1));
            }
          }
          const StagingPlan plan(operation, rank, ranks, chunk_bytes);
          const Sides expected = sides(operation, rank, ranks);
          std::vector<std::byte> host(plan.host_bytes() + 1);
          const std::vector<StagedPiece> pieces = plan.pieces(host.data());
          ASSERT_FALSE(pieces.empty());
          std::vector<int> read(expected.source_bytes), written(expected.destination_bytes);
          std::vector<int> host_filled(plan.host_bytes());
          const auto inside = [&](const void* pointer, std::size_t bytes) {
            const auto* at = static_cast<const std::byte*>(pointer);
            return bytes == 0 || (at >= host.data() && at + bytes <= host.data() + plan.host_bytes());
          };
          for (const StagedPiece& piece : pieces) {
            std::size_t piece_bytes = 0;
            for (const CopySpan& span : piece.down) {
              EXPECT_TRUE(mark(read, span.device_offset, span.bytes)) << "copy down at " << span.device_offset;
              EXPECT_TRUE(mark(host_filled, span.host_offset, span.bytes)) << "host bytes filled twice";
            }
            for (const CopySpan& span : piece.up)
              EXPECT_TRUE(mark(written, span.device_offset, span.bytes)) << "copy up at " << span.device_offset;
            for (const Operation& part : piece.operations) {
              const bool blocks = part.op == CommOp::reduce_scatter || part.op == CommOp::all_gather ||
                                  part.op == CommOp::scatter || part.op == CommOp::gather;
              const std::size_t bytes = part.count * element * (blocks ? static_cast<std::size_t>(ranks) : 1);
              piece_bytes += bytes;
              if (part.send != nullptr) {
                EXPECT_TRUE(inside(part.send, bytes));
              }
              if (part.receive != nullptr) {
                EXPECT_TRUE(inside(part.receive, bytes));
              }
              EXPECT_EQ(part.type, operation.type);
            }
            // A piece carries about a chunk: at most one element per rank's slice beyond it.
            const std::size_t limit = std::max(chunk_bytes, element * static_cast<std::size_t>(ranks));
            const std::size_t messages = test.op == CommOp::all_to_all ? 2 : 1;  // sent and received
            EXPECT_LE(piece_bytes, limit * messages);
          }
          EXPECT_EQ(marked(read), expected.sent);
          EXPECT_EQ(marked(written), expected.received);
          shapes[rank] = shape(pieces);
        }
        for (const auto& [rank, counts] : shapes) EXPECT_EQ(counts, shapes[0]) << "rank " << rank << "'s pieces";
      }
}

TEST(StagingPlan, AllToAllMessagesPairUpAcrossRanks) {
  // Rank r sends (r + 2d + 1) x 37 elements to rank d; each pair's pieces, in order, must be the
  // receiver's pieces from that sender, in order, of the same sizes.
  for (int ranks : {2, 3, 4}) {
    std::map<std::pair<int, int>, std::vector<std::size_t>> sent, received;  // (from, to) -> sizes
    for (int rank = 0; rank < ranks; ++rank) {
      Operation operation{.op = CommOp::all_to_all};
      for (int peer = 0; peer < ranks; ++peer) {
        operation.send_counts.push_back(37 * static_cast<std::size_t>(rank + 2 * peer + 1));
        operation.receive_counts.push_back(37 * static_cast<std::size_t>(peer + 2 * rank + 1));
      }
      static std::byte device_send[1], device_receive[1];
      operation.send = device_send;
      operation.receive = device_receive;
      const StagingPlan plan(operation, rank, ranks, 256);
      std::vector<std::byte> host(plan.host_bytes());
      for (const StagedPiece& piece : plan.pieces(host.data()))
        for (const Operation& message : piece.operations) {
          EXPECT_EQ(message.tag, all_to_all_tag);
          EXPECT_NE(message.peer, rank) << "a rank's own block needs no message";
          if (message.op == CommOp::send) sent[{rank, message.peer}].push_back(message.count);
          if (message.op == CommOp::recv) received[{message.peer, rank}].push_back(message.count);
        }
    }
    EXPECT_EQ(sent, received) << ranks << " ranks";
  }
}
