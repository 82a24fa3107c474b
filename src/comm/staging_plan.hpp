// How a collective on device memory is cut into pieces that flow through host memory, apart from
// MPI and the device: each piece is copies down (device to host), MPI operations on host memory,
// and copies up (host to device), so piece i's operations run while piece i+1 comes down and piece
// i-1 goes up. Every operation gets a shape of its own:
//   all-reduce, reduce, broadcast: a contiguous slice per piece, the operation on that slice;
//   reduce-scatter, scatter, all-gather, gather: the same slice of every rank's block, gathered
//     into one contiguous host piece ([ranks][slice]) so the block operation runs on it;
//   send, recv: a slice per piece, each its own message;
//   all-to-all (equal or variable): slice j of every destination's block per piece, as
//     point-to-point messages (a variable exchange's pieces need no agreement on their count);
//     the rank's own block goes down straight into its place among the received ones.
// Every rank of a group cuts an operation alike (the same chunk size, all on device memory), so
// the pieces' MPI calls match across ranks.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"

namespace mlptrain {

// Bytes between a device buffer (at device_offset from its start) and the host buffer.
struct CopySpan {
  std::size_t device_offset = 0;
  std::size_t host_offset = 0;
  std::size_t bytes = 0;
};

struct StagedPiece {
  std::vector<CopySpan> down;        // from the operation's source before its operations
  std::vector<Operation> operations; // on host memory, started together once `down` has landed
  std::vector<CopySpan> up;          // to the operation's destination once they completed
};

// The tag of an all-to-all's messages, apart from the pipeline's.
inline constexpr int all_to_all_tag = 0x7a11;

class StagingPlan {
 public:
  // `operation` on device memory for rank `rank` of `ranks`, in pieces of about `chunk_bytes`.
  StagingPlan(const Operation& operation, int rank, int ranks, std::size_t chunk_bytes);

  // The host memory the operation is staged through: one region, in place, but for an
  // all-to-all, whose received blocks follow the sent ones.
  std::size_t host_bytes() const { return host_bytes_; }
  // The device buffer copies down read (a broadcast's is its one buffer) and up write.
  const void* source() const { return source_; }
  void* destination() const { return destination_; }
  // The pieces, their copies' host offsets and operations in the region at `host`.
  std::vector<StagedPiece> pieces(std::byte* host) const;

 private:
  void contiguous(std::vector<StagedPiece>& pieces, std::byte* host) const;
  void blocks(std::vector<StagedPiece>& pieces, std::byte* host) const;
  void exchange(std::vector<StagedPiece>& pieces, std::byte* host) const;

  Operation operation_;
  int rank_, ranks_;
  std::size_t element_;
  std::size_t chunk_elements_;  // per slice: of the message, or of each rank's block
  std::size_t host_bytes_ = 0;
  std::size_t received_at_ = 0;  // an all-to-all's received blocks in the host region
  const void* source_ = nullptr;
  void* destination_ = nullptr;
};

}  // namespace mlptrain
