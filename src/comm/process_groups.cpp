// Splits the world communicator into the grid's groups (see process_groups.hpp).
#include "comm/process_groups.hpp"

#include "comm/mpi_communicator.hpp"

namespace mlptrain {

ProcessGroups::ProcessGroups(MPI_Comm world, const GridShape& shape, CommLedger& ledger, CommEngine* engine,
                             bool shared_memory)
    : ProcessGroups(world, shape, [&](MPI_Comm comm, std::string group) -> std::unique_ptr<Communicator> {
        return std::make_unique<MpiCommunicator>(comm, std::move(group), ledger, shared_memory, engine);
      }) {}

ProcessGroups::ProcessGroups(MPI_Comm world, const GridShape& shape, const CommunicatorFactory& make)
    : shape_(shape) {
  MPI_Comm_rank(world, &world_rank_);
  place_ = coordinates_of(shape_, world_rank_);
  for (GroupKind kind : all_group_kinds) {
    MPI_Comm comm = MPI_COMM_NULL;
    if (kind == GroupKind::world) {
      // A communicator of the groups' own: the program's operations on `world` (agreeing on
      // errors) never interleave with the group's started ones.
      MPI_Comm_dup(world, &comm);
    } else if (group_size(shape_, kind) == 1) {
      // A group of one rank needs no split (a slow collective when ranks outnumber cores); every
      // rank knows the shape, so all skip alike.
      comm = MPI_COMM_SELF;
    } else {
      // Every rank takes part in every split, so the calls match across the world.
      MPI_Comm_split(world, group_index_of(shape_, kind, world_rank_), world_rank_, &comm);
    }
    communicators_[static_cast<int>(kind)] = make(comm, std::string(group_name(kind)));
  }
}

}  // namespace mlptrain
