// Rank-to-GPU placement (see gpu_placement.hpp).
#include "comm/gpu_placement.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace mlptrain {

NodePlace node_place(MPI_Comm world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodePlace place;
  MPI_Comm_rank(node, &place.local_rank);
  MPI_Comm_size(node, &place.local_ranks);
  MPI_Comm_free(&node);
  return place;
}

int choose_gpu(const NodePlace& place, int gpus, bool nccl) {
  if (gpus < 1) throw UsageError("--device cuda: this node has no GPU");
  if (nccl && place.local_ranks > gpus)
    throw UsageError(fmt::format(
        "--comm nccl: {} ranks on this node share {} GPU(s), and NCCL allows one rank per GPU "
        "(start at most {} rank(s) per node, or use --comm mpi)",
        place.local_ranks, gpus, gpus));
  return place.local_rank % gpus;
}

}  // namespace mlptrain
