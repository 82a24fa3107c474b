// Rank arithmetic of the process grid (see process_grid.hpp).
#include "core/process_grid.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mlptrain {

std::string_view group_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::world: return "world";
    case GroupKind::tensor: return "tp";
    case GroupKind::data: return "dp";
    case GroupKind::pipeline: return "pp";
    case GroupKind::expert: return "ep";
    case GroupKind::expert_data: return "edp";
    case GroupKind::data_shard: return "dp_shard";
    case GroupKind::data_replica: return "dp_replica";
    case GroupKind::expert_data_shard: return "edp_shard";
    case GroupKind::expert_data_replica: return "edp_replica";
  }
  return "unknown";
}

std::string shape_problem(const GridShape& shape) {
  if (shape.tp < 1 || shape.dp < 1 || shape.pp < 1 || shape.ep < 1)
    return "every parallel degree must be at least 1";
  if (shape.tp * shape.dp * shape.pp != shape.world)
    return "dp x tp x pp = " + std::to_string(shape.dp) + " x " + std::to_string(shape.tp) +
           " x " + std::to_string(shape.pp) + " = " +
           std::to_string(shape.dp * shape.tp * shape.pp) + " does not equal the world size " +
           std::to_string(shape.world);
  if (shape.dp % shape.ep != 0)
    return "ep " + std::to_string(shape.ep) + " does not divide dp " + std::to_string(shape.dp);
  const int shard = shard_ranks(shape);
  if (shard < 1 || shape.dp % shard != 0)
    return "the ZeRO shard size " + std::to_string(shard) + " does not divide dp " + std::to_string(shape.dp);
  // An expert's ranks must fall evenly into the shard groups.
  if (shard % shape.ep != 0 && shape.ep % shard != 0)
    return "the ZeRO shard size " + std::to_string(shard) + " is neither a multiple nor a divisor of ep " +
           std::to_string(shape.ep);
  return {};
}

int group_size(const GridShape& shape, GroupKind kind) {
  switch (kind) {
    case GroupKind::world: return shape.world;
    case GroupKind::tensor: return shape.tp;
    case GroupKind::data: return shape.dp;
    case GroupKind::pipeline: return shape.pp;
    case GroupKind::expert: return shape.ep;
    case GroupKind::expert_data: return shape.dp / shape.ep;
    case GroupKind::data_shard: return shard_ranks(shape);
    case GroupKind::data_replica: return shape.dp / shard_ranks(shape);
    // A shard group of K ranks holds K / ep ranks of each expert when ep divides K, else (K
    // divides ep) one rank of some experts, and each of those ranks is alone in its shard group.
    case GroupKind::expert_data_shard: return std::max(1, shard_ranks(shape) / shape.ep);
    case GroupKind::expert_data_replica:
      return group_size(shape, GroupKind::expert_data) / group_size(shape, GroupKind::expert_data_shard);
  }
  return 1;
}

int shard_ranks(const GridShape& shape) { return shape.zero_shard > 0 ? shape.zero_shard : shape.dp; }

bool hybrid_sharding(const GridShape& shape) { return shard_ranks(shape) < shape.dp; }

GroupKind sharding_group(const GridShape& shape, GroupKind replicas) {
  if (!hybrid_sharding(shape)) return replicas;
  return replicas == GroupKind::expert_data ? GroupKind::expert_data_shard : GroupKind::data_shard;
}

GroupKind shard_replica_group(const GridShape& shape, GroupKind replicas) {
  if (!hybrid_sharding(shape)) return GroupKind::world;  // unused: nothing is summed across
  return replicas == GroupKind::expert_data ? GroupKind::expert_data_replica : GroupKind::data_replica;
}

GridCoordinates coordinates_of(const GridShape& shape, int rank) {
  if (!shape_problem(shape).empty() || rank < 0 || rank >= shape.world)
    throw std::invalid_argument("rank outside a consistent grid");
  GridCoordinates place;
  place.tp = rank % shape.tp;
  place.dp = (rank / shape.tp) % shape.dp;
  place.pp = rank / (shape.tp * shape.dp);
  place.ep = place.dp % shape.ep;
  place.expert_replica = place.dp / shape.ep;
  return place;
}

int rank_of(const GridShape& shape, int tp, int dp, int pp) {
  return tp + shape.tp * (dp + shape.dp * pp);
}

namespace {
// A key that is equal for exactly the ranks sharing a group of this kind.
int group_key(const GridShape& shape, GroupKind kind, int rank) {
  const GridCoordinates place = coordinates_of(shape, rank);
  const int replicas = shape.dp / shape.ep;
  // Hybrid sharding: which shard group of the data-parallel group, and the place within it.
  const int block = place.dp / shard_ranks(shape), position = place.dp % shard_ranks(shape);
  switch (kind) {
    case GroupKind::world: return 0;
    case GroupKind::tensor: return place.dp + shape.dp * place.pp;
    case GroupKind::data: return place.tp + shape.tp * place.pp;
    case GroupKind::pipeline: return place.tp + shape.tp * place.dp;
    case GroupKind::expert:
      return place.tp + shape.tp * (place.expert_replica + replicas * place.pp);
    case GroupKind::expert_data: return place.tp + shape.tp * (place.ep + shape.ep * place.pp);
    case GroupKind::data_shard: return place.tp + shape.tp * (place.pp + shape.pp * block);
    case GroupKind::data_replica: return place.tp + shape.tp * (place.pp + shape.pp * position);
    case GroupKind::expert_data_shard:
      return place.tp + shape.tp * (place.pp + shape.pp * (place.ep + shape.ep * block));
    case GroupKind::expert_data_replica:
      return place.tp + shape.tp * (place.pp + shape.pp * (place.ep + shape.ep * position));
  }
  return 0;
}
}  // namespace

std::vector<std::vector<int>> groups_of(const GridShape& shape, GroupKind kind) {
  std::vector<std::pair<int, std::vector<int>>> keyed;
  for (int rank = 0; rank < shape.world; ++rank) {
    const int key = group_key(shape, kind, rank);
    auto found = std::find_if(keyed.begin(), keyed.end(),
                              [key](const auto& entry) { return entry.first == key; });
    if (found == keyed.end()) {
      keyed.push_back({key, {rank}});
    } else {
      found->second.push_back(rank);
    }
  }
  std::vector<std::vector<int>> groups;
  for (auto& entry : keyed) groups.push_back(std::move(entry.second));
  return groups;  // ranks ascend, so groups are already ordered by their first rank
}

int group_index_of(const GridShape& shape, GroupKind kind, int rank) {
  const auto groups = groups_of(shape, kind);
  for (std::size_t index = 0; index < groups.size(); ++index)
    if (std::find(groups[index].begin(), groups[index].end(), rank) != groups[index].end())
      return static_cast<int>(index);
  throw std::invalid_argument("rank in no group");
}

}  // namespace mlptrain
