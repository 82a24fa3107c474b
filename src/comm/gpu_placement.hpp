// Which GPU a rank drives. Ranks on one node find each other through an MPI shared-memory split
// of the world (their local rank and count) and take the node's GPUs round-robin by local rank.
// Several ranks may share a GPU with MPI host staging; NCCL refuses two ranks on one GPU, so with
// NCCL a node must have at least as many GPUs as ranks.
#pragma once

#include <mpi.h>

namespace mlptrain {

struct NodePlace {
  int local_rank = 0;   // this rank's index among the ranks on its node
  int local_ranks = 1;  // ranks on this node
};

// Collective over `world`.
NodePlace node_place(MPI_Comm world);

// The GPU index for this rank among `gpus` on its node; a UsageError naming the problem when
// there is none, or when NCCL would put two ranks on one GPU.
int choose_gpu(const NodePlace& place, int gpus, bool nccl);

}  // namespace mlptrain
