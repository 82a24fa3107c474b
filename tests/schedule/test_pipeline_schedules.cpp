// Every pipeline schedule against the checker and its own theory: for P = 1..8 stages, V = 1..4
// chunks per stage (interleaved) and M = 1..32 micro-batches wherever the shape suits the
// schedule, all stages' lists run to the end in the strict-rendezvous simulation, training and
// evaluation, with every weight gradient in micro-batch order; each stage's peak of
// (chunk, micro-batch) pairs in flight equals the schedule's theory; the bubble at equal F, B
// and W equals each schedule's formula; interleaved with one chunk is 1F1B; the checker rejects
// a W before its B and a chunk's gradients out of order; a receive after a W is posted after it;
// unsuitable shapes are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "schedule/schedule_check.hpp"
#include "schedule/schedule_table.hpp"

using namespace mlptrain;

namespace {

// Every (kind, shape) the tests cover that suits its schedule.
template <typename Check>
void for_every_valid_shape(Check check) {
  for (const ScheduleEntry& kind : schedule_table())
    for (int stages = 1; stages <= 8; ++stages)
      for (int chunks = 1; chunks <= (kind.chunked ? 4 : 1); ++chunks)
        for (int micro_batches = 1; micro_batches <= 32; ++micro_batches) {
          const PipelineShape shape = schedule_shape(kind, stages, chunks, micro_batches);
          if (!schedule_shape_problem(kind, shape).empty()) continue;
          SCOPED_TRACE(fmt::format("{} P {} V {} M {}", kind.name, stages, shape.chunks, micro_batches));
          check(kind, shape);
        }
}

}  // namespace

TEST(PipelineSchedules, EveryScheduleRunsToTheEndWithoutDeadlock) {
  int checked = 0;
  for_every_valid_shape([&](const ScheduleEntry& kind, const PipelineShape& shape) {
    for (bool training : {true, false}) EXPECT_EQ(check_schedule(all_stage_schedules(kind, shape, training), shape, training), "");
    ++checked;
  });
  EXPECT_GT(checked, 3 * 8 * 32);  // the three one-chunk schedules and the interleaved shapes
}

TEST(PipelineSchedules, AReceiveAfterAWIsPostedOnceTheWIsDone) {
  // A W frees the gradients kept for it, so the next computation's receive (whose buffer is
  // allocated when posted) is posted after the W, never ahead of it.
  const auto receive = [](const Action& action) {
    return action.kind == ActionKind::receive_activations || action.kind == ActionKind::receive_gradients;
  };
  int after_weights = 0;
  for_every_valid_shape([&](const ScheduleEntry& kind, const PipelineShape& shape) {
    for (int stage = 0; stage < shape.stages; ++stage) {
      const std::vector<Action> actions = stage_schedule(kind, shape, stage, true);
      for (std::size_t index = 1; index < actions.size(); ++index) {
        const bool weight = actions[index].kind == ActionKind::backward_weight;
        EXPECT_FALSE(weight && receive(actions[index - 1])) << "stage " << stage << " action " << index;
        if (actions[index - 1].kind == ActionKind::backward_weight && receive(actions[index])) ++after_weights;
      }
    }
  });
  EXPECT_GT(after_weights, 0);  // the rule is met, not avoided: ZB-H1 and ZB-V receive after Ws
}

TEST(PipelineSchedules, EvaluationRunsThroughTheChunksForAnyMicroBatches) {
  // An evaluation's micro-batches need not go round the stages in whole groups.
  for (int stages = 2; stages <= 8; ++stages)
    for (int chunks = 1; chunks <= 4; ++chunks)
      for (int micro_batches = 1; micro_batches <= 9; ++micro_batches) {
        const PipelineShape shape{.stages = stages, .chunks = chunks, .micro_batches = micro_batches};
        EXPECT_EQ(check_schedule(all_stage_schedules(schedule_named("interleaved"), shape, false), shape, false), "")
            << stages << " " << chunks << " " << micro_batches;
      }
}

TEST(PipelineSchedules, ChunksGoRoundTheStages) {
  const std::vector<std::int64_t> costs(12, 1);
  std::vector<int> seen;
  for (int stage = 0; stage < 3; ++stage) {
    const RankLayers layers = stage_chunks(costs, {.stages = 3, .chunks = 2}, stage);
    ASSERT_EQ(layers.chunks.size(), 2u);
    // Global chunk c (two layers each) on stage c mod 3, as local chunk c / 3.
    EXPECT_EQ(layers.chunks[0].first, 2 * stage);
    EXPECT_EQ(layers.chunks[1].first, 2 * (stage + 3));
    EXPECT_EQ(layers.local_index(layers.chunks[1].first), 2);
    EXPECT_FALSE(layers.same_chunk(layers.chunks[0].last - 1, layers.chunks[0].last));
    for (int layer : layers.list()) seen.push_back(layer);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> every(12);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(seen, every);
}

TEST(PipelineSchedules, PeakInFlightEqualsTheTheory) {
  for_every_valid_shape([&](const ScheduleEntry& kind, const PipelineShape& shape) {
    for (int stage = 0; stage < shape.stages; ++stage)
      EXPECT_EQ(peak_micro_batches_in_flight(stage_schedule(kind, shape, stage)),
                kind.peak_in_flight(shape, stage))
          << "stage " << stage;
  });
}

TEST(PipelineSchedules, InterleavedWithOneChunkIsOneFOneB) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int micro_batches = 1; micro_batches <= 16; ++micro_batches)
      for (int stage = 0; stage < stages; ++stage) {
        const PipelineShape shape{.stages = stages, .chunks = 1, .micro_batches = micro_batches};
        EXPECT_EQ(stage_schedule(schedule_named("interleaved"), shape, stage),
                  stage_schedule(schedule_named("1f1b"), shape, stage));
      }
}

// The bubble at equal F, B and W (each 1 for a whole stage, 1/V for a chunk): 1F1B and GPipe
// idle (P - 1)(F + B + W) per stage (Narayanan et al., 2021), interleaved 1F1B divides that by V
// (Narayanan et al., SC'21, with M a multiple of P), ZB-H1 idles (P - 1)(F + B - W), a third of
// 1F1B's (Qi et al., 2023, section 3), once M >= P.
TEST(PipelineSchedules, BubblesAtEqualCostsMatchTheFormulas) {
  for (int stages = 1; stages <= 8; ++stages)
    for (int micro_batches = stages; micro_batches <= 24; micro_batches += stages) {
      SCOPED_TRACE(fmt::format("P {} M {}", stages, micro_batches));
      const auto makespan = [&](const ScheduleEntry& kind, int chunks) {
        const PipelineShape shape = schedule_shape(kind, stages, chunks, micro_batches);
        const double part = 1.0 / shape.chunks;
        return schedule_timeline(all_stage_schedules(kind, shape, true), shape, {part, part, part}).makespan;
      };
      const double work = 3.0 * micro_batches, idle = stages - 1.0;
      EXPECT_DOUBLE_EQ(makespan(schedule_named("1f1b"), 1), work + 3 * idle);
      EXPECT_DOUBLE_EQ(makespan(schedule_named("gpipe"), 1), work + 3 * idle);
      EXPECT_DOUBLE_EQ(makespan(schedule_named("zb-h1"), 1), work + idle);
      // ZB-V: only the first forwards' fill, P - 1 chunk steps of half a stage, once M >= 2P - 1.
      if (micro_batches >= 2 * stages - 1) {
        EXPECT_DOUBLE_EQ(makespan(schedule_named("zb-v"), 1), work + idle / 2);
      }
      for (int chunks = 2; chunks <= 4 && stages > 1; ++chunks)
        EXPECT_NEAR(makespan(schedule_named("interleaved"), chunks), work + 3 * idle / chunks, 1e-9) << chunks;
      // Each table entry's own bubble is the idle fraction of its timeline.
      for (const ScheduleEntry& schedule : schedule_table())
        for (int chunks = 1; chunks <= (schedule.chunked && stages > 1 ? 4 : 1); ++chunks) {
          if (schedule.placement == ChunkPlacement::v_shape && micro_batches < 2 * stages - 1) continue;
          const double span = makespan(schedule, chunks);
          EXPECT_NEAR(schedule.bubble(schedule_shape(schedule, stages, chunks, micro_batches)), (span - work) / span, 1e-9)
              << schedule.name << " V " << chunks;
        }
    }
}

TEST(PipelineSchedules, CheckerRejectsWBeforeBAndGradientsOutOfOrder) {
  const PipelineShape one{.stages = 1, .chunks = 1, .micro_batches = 2};
  EXPECT_NE(check_schedule({{{ActionKind::forward, 0}, {ActionKind::backward_weight, 0}, {ActionKind::backward_input, 0}}},
                           {.stages = 1, .chunks = 1, .micro_batches = 1}, true)
                .find("before its B"),
            std::string::npos);
  EXPECT_NE(check_schedule({{{ActionKind::forward, 0}, {ActionKind::forward, 1}, {ActionKind::backward, 1},
                             {ActionKind::backward, 0}}},
                           one, true)
                .find("micro-batch order"),
            std::string::npos);
  // A ZB-H1 list that loses a W no longer covers every (chunk, micro-batch).
  const PipelineShape shape{.stages = 4, .chunks = 1, .micro_batches = 8};
  auto lists = all_stage_schedules(schedule_named("zb-h1"), shape, true);
  std::erase(lists[2], Action{ActionKind::backward_weight, 5});
  EXPECT_NE(check_schedule(lists, shape, true).find("every (chunk, micro-batch) once"), std::string::npos);
}

TEST(PipelineSchedules, UnsuitableShapesAreRefusedWithTheirReason) {
  EXPECT_NE(schedule_shape_problem(schedule_named("interleaved"), {.stages = 4, .chunks = 2, .micro_batches = 6})
                .find("a multiple of the stages (4)"),
            std::string::npos);
  EXPECT_NE(schedule_shape_problem(schedule_named("interleaved"), {.stages = 1, .chunks = 2, .micro_batches = 4})
                .find("at least 2 stages"),
            std::string::npos);
  EXPECT_NE(schedule_shape_problem(schedule_named("zb-h1"), {.stages = 2, .chunks = 2, .micro_batches = 4})
                .find("one chunk per stage"),
            std::string::npos);
  EXPECT_EQ(schedule_shape_problem(schedule_named("interleaved"), {.stages = 4, .chunks = 3, .micro_batches = 8}), "");
  EXPECT_THROW(stage_schedule(schedule_named("interleaved"), {.stages = 4, .chunks = 2, .micro_batches = 6}, 0),
               std::logic_error);
}
