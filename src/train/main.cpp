// mlptrain: trains a deep MLP under the layout given on the command line (see --help).
// Errors every rank agrees on are reported once by rank 0 and end every rank with the same exit
// code; anything else ends the whole job through MPI_Abort so that no rank is left waiting.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/consensus.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "train/options.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  using namespace mlptrain;
  MPI_Init(&argc, &argv);
  silence_hdf5_errors();
  int rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  int exit_code = 0;
  try {
    CommLedger setup_ledger;
    MpiCommunicator world(MPI_COMM_WORLD, "world", setup_ledger);
    ParsedOptions options;
    agree_or_throw(world, [&] {
      options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
      if (!options.help) validate_options(options.config, world_size);
    });
    if (options.help) {
      if (rank == 0) std::fputs(options.help_text.c_str(), stdout);
    } else {
      // MLPTRAIN_SHARED_MEMORY=0 sends every collective through MPI, to compare the two.
      const char* shared = std::getenv("MLPTRAIN_SHARED_MEMORY");
      run_training(options.config, MPI_COMM_WORLD,
                   {.shared_memory = shared == nullptr || std::string(shared) != "0"});
    }
  } catch (const AgreedError& error) {
    if (rank == 0) std::fprintf(stderr, "mlptrain: error: %s\n", error.what());
    exit_code = static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mlptrain: error on rank %d: %s\n", rank, error.what());
    std::fflush(stderr);
    const int code = dynamic_cast<const Error*>(&error) != nullptr
                         ? static_cast<int>(dynamic_cast<const Error&>(error).code())
                         : 1;
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
  return exit_code;
}
