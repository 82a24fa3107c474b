// One commbench measurement's case: a collective at one size and element type on one group, its
// buffers (host, or device copies of them), the operation, and what every rank must hold
// afterwards, from values each rank can compute for any (rank, element). Sizes follow nccl-tests'
// size column: the buffer for all-reduce and broadcast, the whole output for all-gather, the whole
// input for reduce-scatter, what a rank sends for all-to-all and send/recv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"

namespace mlptrain {

class CollectiveCase {
 public:
  // With a device, the operation runs on device copies of the buffers (a copy moves the send
  // buffer to pinned memory, or pinned memory to the receive buffer, through `copier`).
  CollectiveCase(const std::string& collective, std::int64_t bytes, DataType type, Communicator& group,
                 Allocator* device, AsyncCopier* copier);

  std::int64_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }  // smaller than one element per rank

  // Sets the inputs (and poisons the outputs); a broadcast's buffer is its receive buffer,
  // holding the data at the root.
  void fill();
  void run();
  // Elements of this rank's result that differ from the expected values (after fill, run).
  std::size_t wrong_elements();
  // nccl-tests' bus factor: what each rank's link carries relative to the size.
  double bus_factor() const;

 private:
  std::string collective_;
  DataType type_;
  Communicator& group_;
  std::size_t count_ = 0;
  std::int64_t bytes_ = 0;
  int range_ = 64;
  std::vector<std::byte> send_, receive_;
  std::vector<float> expected_;
  Allocator* device_ = nullptr;
  AsyncCopier* copier_ = nullptr;
  Buffer send_device_, receive_device_, pinned_;
};

}  // namespace mlptrain
