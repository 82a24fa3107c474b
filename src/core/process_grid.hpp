// The process grid as a pure function of (world, tp, dp, pp, ep): tensor-parallel rank varies
// fastest and pipeline stage slowest (Megatron-LM's order), and the expert-parallel group is carved
// out of the data-parallel group with the expert rank varying fastest inside it. No MPI here, so
// the rank lists are unit-tested against golden lists.
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
enum class GroupKind { world, tensor, data, pipeline, expert, expert_data };
inline constexpr GroupKind all_group_kinds[] = {GroupKind::world,    GroupKind::tensor,
                                                GroupKind::data,     GroupKind::pipeline,
                                                GroupKind::expert,   GroupKind::expert_data};
std::string_view group_name(GroupKind kind);

// Ranks in each group of this kind.
int group_size(const GridShape& shape, GroupKind kind);

// Empty when the shape is consistent, else a sentence saying what is wrong.
std::string shape_problem(const GridShape& shape);

GridCoordinates coordinates_of(const GridShape& shape, int rank);
int rank_of(const GridShape& shape, int tp, int dp, int pp);

// Every group of one kind, each an ascending list of ranks; groups ordered by their first rank.
std::vector<std::vector<int>> groups_of(const GridShape& shape, GroupKind kind);
// The index (into groups_of) of the group of `kind` that holds `rank`.
int group_index_of(const GridShape& shape, GroupKind kind, int rank);

}  // namespace mlptrain
