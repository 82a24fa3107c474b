// mlptrain: trains a deep MLP under the layout given on the command line (see --help). Errors
// are reported and end the job as run_mpi_program says.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "command_line/parser.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  using namespace mlptrain;
  return run_mpi_program(argc, argv, "mlptrain", [&](MpiCommunicator& world) {
    silence_hdf5_errors();
    ParsedOptions options;
    CommSettings comm;
    agree_or_throw(world, [&] {
      options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
      if (!options.help) validate_options(options.config, world.size());
      // MLPTRAIN_SHARED_MEMORY=0 sends every collective through MPI, to compare the two.
      const char* shared = std::getenv("MLPTRAIN_SHARED_MEMORY");
      comm.shared_memory = shared == nullptr || std::string(shared) != "0";
      comm.fault = fault_plan_from_environment();
    });
    if (options.help) {
      if (world.rank() == 0) std::fputs(options.help_text.c_str(), stdout);
      return ExitCode::success;
    }
    return run_training(options.config, MPI_COMM_WORLD, comm);
  });
}
