// The frame every MPI program of the project shares: MPI started and finished around the body,
// which gets the world as a communicator. An error all ranks agree on (AgreedError) is reported
// once, by rank 0, as "PROGRAM: error: ..." and ends every rank with its exit code; any other
// error is reported by the rank that met it and ends the whole job through MPI_Abort, so that no
// rank is left waiting. Once every rank's work is done, MPI_Finalize gets a bounded time
// (finalize_guard.hpp): a transport that hangs in its teardown does not keep the job alive.
#pragma once

#include <functional>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"

namespace mlptrain {

// Returns the exit code for main: the body's, or an error's.
int run_mpi_program(int& argc, char**& argv, const char* program,
                    const std::function<ExitCode(MpiCommunicator& world)>& body);

}  // namespace mlptrain
