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
  }
  return 1;
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
  switch (kind) {
    case GroupKind::world: return 0;
    case GroupKind::tensor: return place.dp + shape.dp * place.pp;
    case GroupKind::data: return place.tp + shape.tp * place.pp;
    case GroupKind::pipeline: return place.tp + shape.tp * place.dp;
    case GroupKind::expert:
      return place.tp + shape.tp * (place.expert_replica + replicas * place.pp);
    case GroupKind::expert_data: return place.tp + shape.tp * (place.ep + shape.ep * place.pp);
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
