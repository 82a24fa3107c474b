// The two classic pipeline schedules as data: every stage's generated actions run together in the
// checker's simulation of non-blocking point-to-point transfers (schedule/schedule_check.hpp), for
// P = 1..8 stages and M = 1..32 micro-batches, both kinds, training and evaluation; the checker
// finds broken lists. Also the stage partition by cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <fmt/format.h>
#include <numeric>

#include "schedule/schedule_check.hpp"
#include "schedule/schedule_table.hpp"

using namespace mlptrain;

namespace {

// Stage `stage`'s list of a one-chunk schedule.
std::vector<Action> pipeline_schedule(const ScheduleEntry& kind, int stages, int stage, int micro_batches,
                                      bool training = true) {
  return stage_schedule(kind, {.stages = stages, .chunks = 1, .micro_batches = micro_batches}, stage, training);
}

std::vector<std::vector<Action>> all_stages(const ScheduleEntry& kind, int stages, int micro_batches,
                                            bool training) {
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < stages; ++stage)
    lists.push_back(pipeline_schedule(kind, stages, stage, micro_batches, training));
  return lists;
}

// The checker of schedule_check.hpp for one chunk per stage.
std::string simulate(const std::vector<std::vector<Action>>& lists, bool training) {
  int micro_batches = 0;
  for (const Action& action : lists[0])
    if (action.kind == ActionKind::forward) ++micro_batches;
  return check_schedule(lists, {.stages = static_cast<int>(lists.size()), .chunks = 1, .micro_batches = micro_batches},
                        training);
}

std::vector<Action> computations(const std::vector<Action>& actions) {
  std::vector<Action> kept;
  for (const Action& action : actions)
    if (action.kind == ActionKind::forward || action.kind == ActionKind::backward) kept.push_back(action);
  return kept;
}

}  // namespace

TEST(Schedule, SequentialRunsEachMicroBatchForwardThenBackward) {
  EXPECT_EQ(sequential_schedule(2),
            (std::vector<Action>{{ActionKind::forward, 0}, {ActionKind::backward, 0},
                                 {ActionKind::forward, 1}, {ActionKind::backward, 1}}));
  EXPECT_EQ(peak_micro_batches_in_flight(sequential_schedule(5)), 1);
}

TEST(Schedule, EveryPipelineScheduleRunsToTheEndWithMatchedTransfers) {
  for (const ScheduleEntry& kind : {schedule_named("1f1b"), schedule_named("gpipe")})
    for (int stages = 1; stages <= 8; ++stages)
      for (int micro_batches = 1; micro_batches <= 32; ++micro_batches)
        for (bool training : {true, false}) {
          SCOPED_TRACE(fmt::format("kind {} P {} M {} training {}", kind.name, stages,
                                   micro_batches, training));
          EXPECT_EQ(simulate(all_stages(kind, stages, micro_batches, training), training), "");
        }
}

TEST(Schedule, SimulationFindsBrokenSchedules) {
  std::vector<std::vector<Action>> lists = {{{ActionKind::backward, 0}, {ActionKind::forward, 0}}};
  EXPECT_NE(simulate(lists, true).find("before its forward"), std::string::npos);
  // A receive never posted, a send never made.
  lists = all_stages(schedule_named("1f1b"), 2, 2, true);
  std::erase(lists[1], Action{ActionKind::receive_activations, 1});
  EXPECT_NE(simulate(lists, true).find("deadlock"), std::string::npos);
  lists = all_stages(schedule_named("1f1b"), 3, 4, true);
  std::erase(lists[2], Action{ActionKind::send_gradients, 3});
  EXPECT_NE(simulate(lists, true).find("deadlock"), std::string::npos);
}

TEST(Schedule, OneFOneBWarmsUpThenAlternatesThenDrains) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int micro_batches = 1; micro_batches <= 32; ++micro_batches)
      for (int stage = 0; stage < stages; ++stage) {
        SCOPED_TRACE(fmt::format("P {} M {} stage {}", stages, micro_batches, stage));
        const int warmup = std::min(stages - stage - 1, micro_batches);
        EXPECT_EQ(one_f_one_b_warmup(stages, stage, micro_batches), warmup);
        std::vector<Action> expected;
        for (int index = 0; index < warmup; ++index) expected.push_back({ActionKind::forward, index});
        for (int index = 0; index + warmup < micro_batches; ++index) {
          expected.push_back({ActionKind::forward, index + warmup});
          expected.push_back({ActionKind::backward, index});
        }
        for (int index = micro_batches - warmup; index < micro_batches; ++index)
          expected.push_back({ActionKind::backward, index});
        const auto actions = pipeline_schedule(schedule_named("1f1b"), stages, stage, micro_batches);
        EXPECT_EQ(computations(actions), expected);
        EXPECT_EQ(peak_micro_batches_in_flight(actions), std::min(stages - stage, micro_batches));
        EXPECT_EQ(peak_micro_batches_in_flight(
                      pipeline_schedule(schedule_named("gpipe"), stages, stage, micro_batches)),
                  micro_batches);
      }
}

TEST(Schedule, ReceivesArePostedOneComputationAhead) {
  // Stage 1 of 3, GPipe, two micro-batches: both inputs are awaited before the first forward,
  // the first gradients before the last forward.
  EXPECT_EQ(pipeline_schedule(schedule_named("gpipe"), 3, 1, 2),
            (std::vector<Action>{{ActionKind::receive_activations, 0}, {ActionKind::receive_activations, 1},
                                 {ActionKind::forward, 0}, {ActionKind::send_activations, 0},
                                 {ActionKind::receive_gradients, 0}, {ActionKind::forward, 1},
                                 {ActionKind::send_activations, 1}, {ActionKind::receive_gradients, 1},
                                 {ActionKind::backward, 0}, {ActionKind::send_gradients, 0},
                                 {ActionKind::backward, 1}, {ActionKind::send_gradients, 1}}));
}

TEST(Schedule, PeakActivationBytesFollowsAllocationsAndFrees) {
  // Received inputs (3 bytes each) are allocated when posted, the rest (10 in all) in forward.
  const ActivationProfile stored{.received = 3, .forward_peak = 10, .kept = 10, .backward_peak = 10};
  const auto actions = pipeline_schedule(schedule_named("1f1b"), 2, 1, 4);
  EXPECT_EQ(peak_activation_bytes(actions, stored), 13);  // one micro-batch and the next input
  EXPECT_EQ(peak_activation_bytes(sequential_schedule(4), stored), 10);
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(schedule_named("gpipe"), 2, 0, 4), stored), 40);
  // Recomputation: 4 bytes kept between forward and backward, 7 at most during either.
  const ActivationProfile recomputed{.received = 3, .forward_peak = 6, .kept = 4, .backward_peak = 7};
  EXPECT_EQ(peak_activation_bytes(sequential_schedule(4), recomputed), 7);
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(schedule_named("gpipe"), 2, 0, 4), recomputed),
            3 * 4 + 7);  // three micro-batches kept while the last one's backward runs
  // Stage 0 of two under 1F1B keeps two micro-batches: the second's forward peaks over the first.
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(schedule_named("1f1b"), 2, 0, 4), recomputed),
            4 + 7);
}

TEST(Schedule, StagesAreContiguousNonEmptyAndMinimizeTheLargestCost) {
  // Against every way to cut small models.
  const std::vector<std::vector<std::int64_t>> models = {
      {1, 8, 8, 8, 8, 8, 8, 8, 8, 1}, {5, 1, 1, 1, 1, 5}, {1, 1, 1, 1}, {3, 9, 2, 7, 7, 1, 4}, {2, 2}};
  for (const auto& costs : models)
    for (int stages = 1; stages <= static_cast<int>(costs.size()); ++stages) {
      SCOPED_TRACE(fmt::format("costs {} stages {}", fmt::join(costs, ","), stages));
      const auto ranges = balanced_stages(costs, stages);
      ASSERT_EQ(static_cast<int>(ranges.size()), stages);
      std::int64_t largest = 0;
      for (std::size_t stage = 0; stage < ranges.size(); ++stage) {
        EXPECT_EQ(ranges[stage].first, stage == 0 ? 0 : ranges[stage - 1].last);
        EXPECT_LT(ranges[stage].first, ranges[stage].last);
        largest = std::max(largest, std::accumulate(costs.begin() + ranges[stage].first,
                                                    costs.begin() + ranges[stage].last, std::int64_t{0}));
      }
      EXPECT_EQ(ranges.back().last, static_cast<int>(costs.size()));
      // The best largest stage over all cuts (bit i set: a cut before layer i + 1).
      const int layers = static_cast<int>(costs.size());
      std::int64_t best = std::accumulate(costs.begin(), costs.end(), std::int64_t{0});
      for (unsigned cuts = 0; cuts < (1u << (layers - 1)); ++cuts) {
        if (std::popcount(cuts) != stages - 1) continue;
        std::int64_t sum = 0, worst = 0;
        for (int layer = 0; layer < layers; ++layer) {
          sum += costs[static_cast<std::size_t>(layer)];
          if (layer + 1 == layers || (cuts >> layer & 1u)) {
            worst = std::max(worst, sum);
            sum = 0;
          }
        }
        best = std::min(best, worst);
      }
      EXPECT_EQ(largest, best);
    }
  const auto ten = balanced_stages({1, 8, 8, 8, 8, 8, 8, 8, 8, 1}, 2);
  EXPECT_EQ(ten[0].last, 5);  // the cheap first and last layers balance each other
}
