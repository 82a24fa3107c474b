// The shared frame of MPI programs (see mpi_program.hpp).
#include "comm/mpi_program.hpp"

#include <chrono>
#include <cstdio>

#include "comm/finalize_guard.hpp"
#include "core/error.hpp"

namespace mlptrain {
namespace {

// Every rank's work is done when the guard starts (a barrier says so): what is left is the
// transport's teardown, which takes milliseconds when it works.
constexpr std::chrono::seconds kFinalizeGrace{10};

}  // namespace

int run_mpi_program(int& argc, char**& argv, const char* program,
                    const std::function<ExitCode(MpiCommunicator& world)>& body) {
  // Threads: the communication engine's thread calls MPI beside the program's (comm_engine.hpp).
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int exit_code = 0;
  try {
    CommLedger ledger;  // what the program's setup communicates; its own work has its own
    MpiCommunicator world(MPI_COMM_WORLD, "world", ledger);
    exit_code = static_cast<int>(body(world));
  } catch (const AgreedError& error) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, error.what());
    exit_code = static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank, error.what());
    std::fflush(stderr);
    const auto* known = dynamic_cast<const Error*>(&error);
    MPI_Abort(MPI_COMM_WORLD, known != nullptr ? static_cast<int>(known->code()) : 1);
  }
  std::fflush(nullptr);  // what the run printed is out before the teardown, whatever it does
  MPI_Barrier(MPI_COMM_WORLD);
  {
    FinalizeGuard guard(program, rank, exit_code, kFinalizeGrace);
    MPI_Finalize();
  }
  return exit_code;
}

}  // namespace mlptrain
