// One commbench measurement's case: a collective at one size and element type on one group, in
// place or not, its buffers (host, or device copies of them), the operation, and what this rank
// must hold afterwards, from values each rank can compute for any (rank, element). Sizes follow
// nccl-tests' size column: the buffer for all-reduce, reduce and broadcast, the whole output for
// all-gather and gather, the whole input for reduce-scatter and scatter, what a rank sends for
// all-to-all and send/recv. Rooted operations have rank 0 as root; only the root checks a reduce
// or a gather. `mpi_all_reduce` is MPI_Allreduce called directly on host buffers, the baseline
// the communicator's all-reduce is held against.
// Results are exact but for sums of 16-bit floats: there the inputs are 1 + k/128 (exact in bf16
// and fp16, so every input is at least 1) and each element is held against the fp32 sum of the
// same inputs within n u sum|x| (u = 2^-8 for bf16, 2^-11 for fp16: the bound of n - 1 rounded
// additions, gamma_(n-1) sum|x|, plus the last rounding to the format). Up to 8 ranks in bf16 (32
// in fp16) that is below 1, the least a missing or doubled contribution changes a sum, so the
// check rejects them.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/commbench_options.hpp"
#include "comm/communicator.hpp"
#include "core/buffer.hpp"

namespace mlptrain {

class CollectiveCase {
 public:
  // With a device, the operation runs on device copies of the buffers (a copy moves the send
  // buffer to pinned memory, or pinned memory to the receive buffer, through `copier`).
  // `raw` is the group's own MPI communicator, for mpi_all_reduce.
  CollectiveCase(const std::string& collective, std::int64_t bytes, DataType type, bool in_place,
                 Communicator& group, MPI_Comm raw, Allocator* device, AsyncCopier* copier);

  // Whether a collective has an in-place form (one buffer, this rank's block of it as input or
  // output where the operation takes or leaves one block).
  static bool has_in_place(const std::string& collective);

  std::int64_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }  // smaller than one element per rank

  // Sets the inputs (and poisons the outputs); a broadcast's buffer holds the data at the root.
  void fill();
  // Runs the operation once, to completion or started and then waited for, after the host has
  // computed for `compute_us` (a loop that calls nothing, as the launching thread's work).
  void run(Issue issue = Issue::blocking, double compute_us = 0);
  // Whether the case is an operation the strategies may start (not a device copy or the
  // MPI_Allreduce baseline).
  static bool can_start(const std::string& collective);
  // Elements of this rank's result that differ from the expected values (after fill, run), and
  // the largest difference and the largest allowed one (both 0 where results are exact).
  std::size_t wrong_elements();
  double max_error() const { return max_error_; }
  double error_bound() const { return error_bound_; }
  // nccl-tests' bus factor: what each rank's link carries relative to the size.
  double bus_factor() const;

 private:
  bool takes_block() const;   // the input is one block (all_gather, gather)
  bool leaves_block() const;  // the output is one block (reduce_scatter, scatter)
  float input(std::size_t element) const;  // this rank's input element (in its own block)
  float value_of(int rank, std::size_t element) const;  // any rank's

  std::string collective_;
  DataType type_;
  bool in_place_ = false;
  Communicator& group_;
  MPI_Comm raw_;
  int rank_ = 0;
  int ranks_ = 1;
  std::size_t count_ = 0;  // Operation's count
  std::size_t whole_ = 0;  // elements of the whole buffer
  std::int64_t bytes_ = 0;
  int range_ = 64;
  std::vector<std::byte> send_, receive_;  // in place: receive_ only
  std::size_t check_offset_ = 0;           // where the checked elements start in the result
  std::vector<float> expected_;
  bool rounds_ = false;        // a sum of 16-bit floats: held within a bound, not exactly
  std::vector<float> bounds_;  // per checked element, when it rounds
  double max_error_ = 0;
  double error_bound_ = 0;
  Allocator* device_ = nullptr;
  AsyncCopier* copier_ = nullptr;
  Buffer send_device_, receive_device_, pinned_;
};

}  // namespace mlptrain
