// Process grid: rank lists of every group kind against golden lists (no MPI).
#include <gtest/gtest.h>

#include "core/process_grid.hpp"

using namespace mlptrain;
using Groups = std::vector<std::vector<int>>;

TEST(ProcessGrid, MegatronExampleSixteenRanksTwoTensorFourPipeline) {
  // The example in Megatron-LM's initialize_model_parallel documentation.
  const GridShape shape{.world = 16, .tp = 2, .dp = 2, .pp = 4, .ep = 1};
  EXPECT_EQ(groups_of(shape, GroupKind::tensor),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(groups_of(shape, GroupKind::pipeline),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(groups_of(shape, GroupKind::data),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
}

TEST(ProcessGrid, EightRanksTwoEachWay) {
  const GridShape shape{.world = 8, .tp = 2, .dp = 2, .pp = 2, .ep = 1};
  EXPECT_EQ(groups_of(shape, GroupKind::tensor), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(groups_of(shape, GroupKind::data), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(shape, GroupKind::pipeline), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(groups_of(shape, GroupKind::world), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  const GridCoordinates place = coordinates_of(shape, 6);
  EXPECT_EQ(place.tp, 0);
  EXPECT_EQ(place.dp, 1);
  EXPECT_EQ(place.pp, 1);
  EXPECT_EQ(rank_of(shape, 1, 1, 1), 7);
}

TEST(ProcessGrid, ExpertGroupsAreCarvedFromTheDataGroup) {
  // dp = 4 split into ep = 2 (expert rank fastest) times 2 replicas.
  const GridShape shape{.world = 8, .tp = 2, .dp = 4, .pp = 1, .ep = 2};
  EXPECT_EQ(groups_of(shape, GroupKind::data), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(groups_of(shape, GroupKind::expert), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(shape, GroupKind::expert_data), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const GridCoordinates place = coordinates_of(shape, 5);
  EXPECT_EQ(place.dp, 2);
  EXPECT_EQ(place.ep, 0);
  EXPECT_EQ(place.expert_replica, 1);
}

TEST(ProcessGrid, HybridShardingCutsTheDataGroupIntoShardAndReplicaGroups) {
  // dp = 8 (tp = 2, so data ranks are two apart) in shard groups of 4: two groups of four
  // consecutive data ranks, and four replica groups of the same place in each.
  const GridShape shape{.world = 16, .tp = 2, .dp = 8, .pp = 1, .ep = 1, .zero_shard = 4};
  EXPECT_TRUE(hybrid_sharding(shape));
  EXPECT_EQ(groups_of(shape, GroupKind::data_shard), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(groups_of(shape, GroupKind::data_replica),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(sharding_group(shape, GroupKind::data), GroupKind::data_shard);
  EXPECT_EQ(shard_replica_group(shape, GroupKind::expert_data), GroupKind::expert_data_replica);
  // Without a shard size, or with the whole group, nothing is hybrid.
  EXPECT_FALSE(hybrid_sharding({.world = 4, .tp = 1, .dp = 4, .pp = 1, .ep = 1}));
  EXPECT_FALSE(hybrid_sharding({.world = 4, .tp = 1, .dp = 4, .pp = 1, .ep = 1, .zero_shard = 4}));
  EXPECT_EQ(sharding_group({.world = 4, .tp = 1, .dp = 4, .pp = 1, .ep = 1}, GroupKind::data), GroupKind::data);
}

TEST(ProcessGrid, HybridShardingOfExpertReplicas) {
  // dp = 8, ep = 2: expert 0 on even data ranks. Shard groups of 4 hold two ranks of each expert.
  const GridShape wide{.world = 8, .tp = 1, .dp = 8, .pp = 1, .ep = 2, .zero_shard = 4};
  EXPECT_EQ(groups_of(wide, GroupKind::expert_data_shard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(wide, GroupKind::expert_data_replica), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(group_size(wide, GroupKind::expert_data_shard), 2);
  EXPECT_EQ(group_size(wide, GroupKind::expert_data_replica), 2);
  // ep = 4, shard groups of 2: each expert rank is alone in its shard group, and its replicas
  // are the whole edp group.
  const GridShape narrow{.world = 8, .tp = 1, .dp = 8, .pp = 1, .ep = 4, .zero_shard = 2};
  EXPECT_EQ(groups_of(narrow, GroupKind::expert_data_shard), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(groups_of(narrow, GroupKind::expert_data_replica), groups_of(narrow, GroupKind::expert_data));
  EXPECT_EQ(group_size(narrow, GroupKind::expert_data_replica), 2);
  // Shard sizes that do not divide dp, or cut an expert's ranks unevenly, are refused.
  EXPECT_NE(shape_problem({.world = 8, .tp = 1, .dp = 8, .pp = 1, .ep = 1, .zero_shard = 3}).find("shard size 3"),
            std::string::npos);
  EXPECT_NE(shape_problem({.world = 12, .tp = 1, .dp = 12, .pp = 1, .ep = 4, .zero_shard = 6}).find("ep 4"),
            std::string::npos);
}

TEST(ProcessGrid, PureDataParallelAndOneProcess) {
  const GridShape four{.world = 4, .tp = 1, .dp = 4, .pp = 1, .ep = 1};
  EXPECT_EQ(groups_of(four, GroupKind::data), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(groups_of(four, GroupKind::tensor), (Groups{{0}, {1}, {2}, {3}}));
  const GridShape one{};
  EXPECT_EQ(groups_of(one, GroupKind::pipeline), (Groups{{0}}));
  EXPECT_EQ(group_index_of(four, GroupKind::tensor, 2), 2);
}

TEST(ProcessGrid, InconsistentShapesAreNamed) {
  EXPECT_NE(shape_problem({.world = 4, .tp = 3, .dp = 1, .pp = 1, .ep = 1}), "");
  EXPECT_NE(shape_problem({.world = 4, .tp = 1, .dp = 4, .pp = 1, .ep = 3}).find("ep 3"),
            std::string::npos);
  EXPECT_EQ(shape_problem({.world = 4, .tp = 2, .dp = 2, .pp = 1, .ep = 2}), "");
  EXPECT_THROW(coordinates_of({.world = 4, .tp = 3, .dp = 1, .pp = 1, .ep = 1}, 0),
               std::invalid_argument);
}
