// The process grid made real: one communicator per group kind that holds this rank, split from
// the world communicator along the pure grid of process_grid.hpp.
#pragma once

#include <mpi.h>

#include <array>
#include <functional>
#include <memory>
#include <string>

#include "comm/comm_engine.hpp"
#include "comm/communicator.hpp"
#include "core/process_grid.hpp"

namespace mlptrain {

// Makes a group's communicator from its MPI communicator (owned from then on) and its name.
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(MPI_Comm comm, std::string group)>;

class ProcessGroups {
 public:
  // MPI communicators on host memory, their operations run by `engine` (null: on the calling
  // thread). `shared_memory`: let node-local groups run collectives in shared memory.
  ProcessGroups(MPI_Comm world, const GridShape& shape, CommLedger& ledger, CommEngine* engine,
                bool shared_memory = true);
  // Communicators from `make`, called for the groups in the same order on every rank.
  ProcessGroups(MPI_Comm world, const GridShape& shape, const CommunicatorFactory& make);

  const GridShape& shape() const { return shape_; }
  const GridCoordinates& place() const { return place_; }
  int world_rank() const { return world_rank_; }
  Communicator& group(GroupKind kind) const { return *communicators_[static_cast<int>(kind)]; }
  Communicator& world() const { return group(GroupKind::world); }

 private:
  GridShape shape_;
  GridCoordinates place_;
  int world_rank_ = 0;
  std::array<std::unique_ptr<Communicator>, std::size(all_group_kinds)> communicators_;
};

}  // namespace mlptrain
