// The shared frame of MPI programs (see mpi_program.hpp).
#include "comm/mpi_program.hpp"

#include <cstdio>

#include "core/error.hpp"

namespace mlptrain {

int run_mpi_program(int& argc, char**& argv, const char* program,
                    const std::function<void(MpiCommunicator& world)>& body) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int exit_code = 0;
  try {
    CommLedger ledger;  // what the program's setup communicates; its own work has its own
    MpiCommunicator world(MPI_COMM_WORLD, "world", ledger);
    body(world);
  } catch (const AgreedError& error) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, error.what());
    exit_code = static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank, error.what());
    std::fflush(stderr);
    const auto* known = dynamic_cast<const Error*>(&error);
    MPI_Abort(MPI_COMM_WORLD, known != nullptr ? static_cast<int>(known->code()) : 1);
  }
  MPI_Finalize();
  return exit_code;
}

}  // namespace mlptrain
