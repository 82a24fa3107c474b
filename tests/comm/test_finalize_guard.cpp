// The teardown guard: a teardown that ends in time leaves the process alone; one that does not
// ends the process with the program's exit code and one line naming the rank, whatever the
// teardown was still doing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/finalize_guard.hpp"

using namespace mlptrain;
using namespace std::chrono_literals;

TEST(FinalizeGuard, ATeardownThatEndsInTimeIsLeftAlone) {
  const auto start = std::chrono::steady_clock::now();
  {
    FinalizeGuard guard("program", 0, 3, 10s);
    std::this_thread::sleep_for(10ms);
  }
  // Destroying the guard wakes its thread at once; it does not wait out the grace period.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(FinalizeGuardDeathTest, AHungTeardownEndsWithTheProgramsExitCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const int exit_code : {0, 2}) {
    EXPECT_EXIT(
        {
          FinalizeGuard guard("program", 1, exit_code, 50ms);
          std::this_thread::sleep_for(60s);  // a teardown that never returns
          std::exit(99);
        },
        testing::ExitedWithCode(exit_code),
        "program: rank 1: MPI_Finalize has not returned 0.05 s after the work ended .*ending with exit code");
  }
}
