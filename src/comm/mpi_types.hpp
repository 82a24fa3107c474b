// How the project's element types, reductions and counts map onto MPI's: datatypes, operations
// (MPI has no arithmetic on 16-bit floats, so their sums are operations of our own), int counts
// checked against MPI's limit, and the int arrays of a variable all-to-all.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "core/data_type.hpp"

namespace mlptrain {

// MPI's sum operations for the 16-bit floats, made with MPI_Op_create and freed with their owner
// (unless MPI has been finalized by then).
class MpiHalfSums {
 public:
  MpiHalfSums();
  ~MpiHalfSums();
  MpiHalfSums(const MpiHalfSums&) = delete;
  MpiHalfSums& operator=(const MpiHalfSums&) = delete;
  MPI_Op bfloat16 = MPI_OP_NULL;
  MPI_Op float16 = MPI_OP_NULL;
};

MPI_Datatype mpi_type(DataType type);
MPI_Op mpi_op(ReduceOp reduce, DataType type, const MpiHalfSums& half_sums);
// `count` as MPI's int; throws RuntimeFailure past INT_MAX.
int mpi_count(std::size_t count);

// Per-rank counts and packed displacements for MPI_Alltoallv.
struct VariableLayout {
  std::vector<int> send_counts, send_offsets, receive_counts, receive_offsets;

  explicit VariableLayout(const Operation& operation);
};

}  // namespace mlptrain
