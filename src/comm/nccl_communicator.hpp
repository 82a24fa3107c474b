// The NCCL backend of Communicator (--comm nccl): one NCCL communicator per process group,
// bootstrapped over the group's MPI communicator (rank 0's unique id broadcast to the others),
// with collectives on a communication stream of its own. An operation is ordered after the
// work queued so far on the compute stream by an event, so a gradient reduction started in a
// backward hook waits for that layer's kernels on the GPU, not on the host, and runs while the
// rest of backward computes. Operations on host memory (the step's world sums, MoE statistics,
// checkpoint bookkeeping) go through MPI on a duplicate of the group's communicator. Built
// only with the CUDA backend; plain C++ here, so callers need no CUDA or NCCL headers.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace mlptrain {

// Whether this build has the NCCL backend.
bool nccl_backend_built();

// A communicator over the ranks of `comm` (owned from here on; collective over them), ordered
// after `compute_stream` (a cudaStream_t; null: the legacy default stream). Each rank must have
// its GPU selected already, one rank per GPU. Throws RuntimeFailure when NCCL cannot start.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string group,
                                                     CommLedger& ledger, void* compute_stream);

}  // namespace mlptrain
