// The process grid as a pure function of (world, tp, dp, pp, ep, zero_shard): tensor-parallel rank
// varies fastest and pipeline stage slowest (Megatron-LM's order), and the expert-parallel group is
// carved out of the data-parallel group with the expert rank varying fastest inside it. Hybrid
// sharding cuts the data-parallel group into shard groups of zero_shard consecutive ranks (one
// node, when a node holds them) and replica groups across them. No MPI here, so the rank lists
// are unit-tested against golden lists.
#pragma once

#include <string_view>
#include <vector>

namespace mlptrain {

struct GridShape {
  int world = 1;
  int tp = 1;
  int dp = 1;
  int pp = 1;
  int ep = 1;
  // ZeRO's shard group: this many consecutive data-parallel ranks (0: the whole group).
  int zero_shard = 0;
};

// A rank's place in every dimension. The data-parallel rank splits as
// dp = expert_replica * ep + ep.
struct GridCoordinates {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  int ep = 0;
  int expert_replica = 0;
};

// Kinds of process groups. `expert_data` joins the ranks that hold replicas of the same experts.
// Under hybrid sharding, `data_shard` joins the zero_shard consecutive data-parallel ranks that
// share one copy of the state, `data_replica` the ranks that hold the same shard in each of those
// groups; `expert_data_shard` and `expert_data_replica` cut the expert_data group alike (the
// ranks of one expert inside a shard group, and the same position across them).
enum class GroupKind {
  world,
  tensor,
  data,
  pipeline,
  expert,
  expert_data,
  data_shard,
  data_replica,
  expert_data_shard,
  expert_data_replica
};
inline constexpr GroupKind all_group_kinds[] = {
    GroupKind::world,       GroupKind::tensor,       GroupKind::data,
    GroupKind::pipeline,    GroupKind::expert,       GroupKind::expert_data,
    GroupKind::data_shard,  GroupKind::data_replica, GroupKind::expert_data_shard,
    GroupKind::expert_data_replica};
std::string_view group_name(GroupKind kind);

// Ranks in each group of this kind.
int group_size(const GridShape& shape, GroupKind kind);

// The ranks of ZeRO's shard group (the whole data-parallel group unless sharding is hybrid), and
// whether it is hybrid: shards span fewer ranks than the data-parallel group and are replicated
// across the rest.
int shard_ranks(const GridShape& shape);
bool hybrid_sharding(const GridShape& shape);
// The groups ZeRO shards a piece over and sums its shards across, for a piece replicated over
// `replicas` (data or expert_data): under hybrid sharding the shard and replica groups cut from
// it, else the group itself and none.
GroupKind sharding_group(const GridShape& shape, GroupKind replicas);
GroupKind shard_replica_group(const GridShape& shape, GroupKind replicas);

// Empty when the shape is consistent, else a sentence saying what is wrong.
std::string shape_problem(const GridShape& shape);

GridCoordinates coordinates_of(const GridShape& shape, int rank);
int rank_of(const GridShape& shape, int tp, int dp, int pp);

// Every group of one kind, each an ascending list of ranks; groups ordered by their first rank.
std::vector<std::vector<int>> groups_of(const GridShape& shape, GroupKind kind);
// The index (into groups_of) of the group of `kind` that holds `rank`.
int group_index_of(const GridShape& shape, GroupKind kind, int rank);

}  // namespace mlptrain
