// main() for GoogleTest binaries run under mpiexec: every rank runs every test; only rank 0
// prints; the exit code is non-zero on every rank if a test failed on any.
#include <gtest/gtest.h>
#include <mpi.h>

#include "core/hdf5_handle.hpp"

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;  // as the programs ask (comm/mpi_program.cpp)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mlptrain::silence_hdf5_errors();
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
