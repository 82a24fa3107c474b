// Every rank's text at rank 0, in rank order: for output one process must write (a trace file,
// a bench's lines), since the lines of several processes that mpiexec merges into one stream can
// interleave mid-line.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace mlptrain {

// Collective over `world`: rank 0 calls `take` with its own `mine`, then with each other rank's
// in rank order, holding one rank's text at a time; the other ranks send theirs.
void texts_to_rank_zero(MPI_Comm world, const std::string& mine, const std::function<void(const std::string&)>& take);

}  // namespace mlptrain
