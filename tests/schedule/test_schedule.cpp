// Pipeline schedules as data: every stage's generated actions run together in a simulation of
// non-blocking point-to-point transfers, for P = 1..8 stages and M = 1..32 micro-batches, both
// kinds, training and evaluation. Also the stage partition by cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <numeric>
#include <tuple>

#include "schedule/schedule.hpp"

using namespace mlptrain;

namespace {

// A transfer between two neighbouring stages: (sending stage, receiving stage, what, micro-batch).
using Message = std::tuple<int, int, bool /*activations*/, int>;

// Runs every stage's list the way the executor does, with MPI's strictest semantics: sends and
// receives are only posted, and a send completes only once its receive is posted (a rendezvous).
// A forward waits until its input's receive is posted here and the matching send was posted by
// the previous stage (a backward likewise, from the next stage); a backward first waits for its
// micro-batch's activation send to complete (its memory is freed), evaluation waits for each
// send at once, and a list ends waiting for every send. Every condition, once true, stays true,
// so if one interleaving of the stages finishes, every interleaving does: running each stage as
// far as it can in turn finds a deadlock if any order has one. Returns the first problem found.
std::string simulate(const std::vector<std::vector<Action>>& lists, bool training) {
  const int stages = static_cast<int>(lists.size());
  std::map<Message, int> sent_posts, received_posts;  // posted so far, by message
  // Reads never insert, so the maps hold only what was posted.
  const auto sent = [&](const Message& message) {
    const auto found = sent_posts.find(message);
    return found == sent_posts.end() ? 0 : found->second;
  };
  const auto received = [&](const Message& message) {
    const auto found = received_posts.find(message);
    return found == received_posts.end() ? 0 : found->second;
  };
  std::vector<std::size_t> next(lists.size(), 0);
  std::vector<std::vector<std::vector<int>>> computed(
      lists.size(), std::vector<std::vector<int>>(2));  // per stage: forwards, backwards done
  const auto message_of = [&](int stage, const Action& action) -> Message {
    switch (action.kind) {
      case ActionKind::send_activations: return {stage, stage + 1, true, action.micro_batch};
      case ActionKind::receive_activations: return {stage - 1, stage, true, action.micro_batch};
      case ActionKind::send_gradients: return {stage, stage - 1, false, action.micro_batch};
      case ActionKind::receive_gradients: return {stage + 1, stage, false, action.micro_batch};
      default: return {};
    }
  };
  const auto ready = [&](int stage, const Action& action) {
    const int micro_batch = action.micro_batch;
    if (action.kind == ActionKind::forward && stage > 0) {
      const Message input{stage - 1, stage, true, micro_batch};
      return received(input) > 0 && sent(input) > 0;
    }
    if (action.kind == ActionKind::backward) {
      const Message output{stage, stage + 1, true, micro_batch};
      if (sent(output) > 0 && received(output) == 0) return false;  // its send must complete
      if (stage + 1 == stages) return true;
      const Message input{stage + 1, stage, false, micro_batch};
      return received(input) > 0 && sent(input) > 0;
    }
    return true;
  };
  // A stage's list is over once each of its sends has its receive posted (and, evaluating,
  // each send is waited for as soon as it is posted).
  const auto sends_complete = [&](int stage) {
    for (const auto& [message, count] : sent_posts)
      if (std::get<0>(message) == stage && received(message) == 0) return false;
    return true;
  };
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int stage = 0; stage < stages; ++stage) {
      const auto& list = lists[static_cast<std::size_t>(stage)];
      auto& at = next[static_cast<std::size_t>(stage)];
      while (at < list.size() && ready(stage, list[at]) && (training || sends_complete(stage))) {
        const Action& action = list[at];
        auto& done = computed[static_cast<std::size_t>(stage)];
        switch (action.kind) {
          case ActionKind::forward:
          case ActionKind::backward: {
            const bool forward = action.kind == ActionKind::forward;
            if (!forward && std::count(done[0].begin(), done[0].end(), action.micro_batch) == 0)
              return fmt::format("stage {} runs backward {} before its forward", stage, action.micro_batch);
            done[forward ? 0 : 1].push_back(action.micro_batch);
            break;
          }
          case ActionKind::send_activations:
          case ActionKind::send_gradients: {
            const Message message = message_of(stage, action);
            if (std::get<1>(message) < 0 || std::get<1>(message) >= stages)
              return fmt::format("stage {} sends beyond the pipeline", stage);
            const bool activations = action.kind == ActionKind::send_activations;
            if (std::count(done[activations ? 0 : 1].begin(), done[activations ? 0 : 1].end(),
                           action.micro_batch) == 0)
              return fmt::format("stage {} sends micro-batch {} before computing it", stage, action.micro_batch);
            ++sent_posts[message];
            break;
          }
          case ActionKind::receive_activations:
          case ActionKind::receive_gradients: {
            const Message message = message_of(stage, action);
            if (std::get<0>(message) < 0 || std::get<0>(message) >= stages)
              return fmt::format("stage {} receives from beyond the pipeline", stage);
            ++received_posts[message];
            break;
          }
        }
        ++at;
        progressed = true;
      }
    }
  }
  for (int stage = 0; stage < stages; ++stage)
    if (next[static_cast<std::size_t>(stage)] < lists[static_cast<std::size_t>(stage)].size() ||
        !sends_complete(stage))
      return fmt::format("deadlock: stage {} waits at action {}", stage, next[static_cast<std::size_t>(stage)]);
  // Every send is received exactly once and nothing is received that was not sent.
  for (const auto& [message, count] : sent_posts)
    if (count != 1 || received(message) != 1) return "a send without exactly one matching receive";
  for (const auto& [message, count] : received_posts)
    if (count != 1 || sent(message) != 1) return "a receive without exactly one matching send";
  // Every micro-batch once forward (and, training, once backward) on every stage.
  const auto micro_batches = static_cast<int>(computed[0][0].size());
  for (int stage = 0; stage < stages; ++stage)
    for (int pass = 0; pass < (training ? 2 : 1); ++pass) {
      std::vector<int> done = computed[static_cast<std::size_t>(stage)][static_cast<std::size_t>(pass)];
      std::sort(done.begin(), done.end());
      std::vector<int> expected(static_cast<std::size_t>(micro_batches));
      std::iota(expected.begin(), expected.end(), 0);
      if (done != expected) return fmt::format("stage {} does not run every micro-batch once", stage);
    }
  return {};
}

std::vector<std::vector<Action>> all_stages(PipelineKind kind, int stages, int micro_batches,
                                            bool training) {
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < stages; ++stage)
    lists.push_back(pipeline_schedule(kind, stages, stage, micro_batches, training));
  return lists;
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
  for (PipelineKind kind : {PipelineKind::one_f_one_b, PipelineKind::gpipe})
    for (int stages = 1; stages <= 8; ++stages)
      for (int micro_batches = 1; micro_batches <= 32; ++micro_batches)
        for (bool training : {true, false}) {
          SCOPED_TRACE(fmt::format("kind {} P {} M {} training {}", static_cast<int>(kind), stages,
                                   micro_batches, training));
          EXPECT_EQ(simulate(all_stages(kind, stages, micro_batches, training), training), "");
        }
}

TEST(Schedule, SimulationFindsBrokenSchedules) {
  std::vector<std::vector<Action>> lists = {{{ActionKind::backward, 0}, {ActionKind::forward, 0}}};
  EXPECT_NE(simulate(lists, true).find("before its forward"), std::string::npos);
  // A receive never posted, a send never made.
  lists = all_stages(PipelineKind::one_f_one_b, 2, 2, true);
  std::erase(lists[1], Action{ActionKind::receive_activations, 1});
  EXPECT_NE(simulate(lists, true).find("deadlock"), std::string::npos);
  lists = all_stages(PipelineKind::one_f_one_b, 3, 4, true);
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
        const auto actions = pipeline_schedule(PipelineKind::one_f_one_b, stages, stage, micro_batches);
        EXPECT_EQ(computations(actions), expected);
        EXPECT_EQ(peak_micro_batches_in_flight(actions), std::min(stages - stage, micro_batches));
        EXPECT_EQ(peak_micro_batches_in_flight(
                      pipeline_schedule(PipelineKind::gpipe, stages, stage, micro_batches)),
                  micro_batches);
      }
}

TEST(Schedule, ReceivesArePostedOneComputationAhead) {
  // Stage 1 of 3, GPipe, two micro-batches: both inputs are awaited before the first forward,
  // the first gradients before the last forward.
  EXPECT_EQ(pipeline_schedule(PipelineKind::gpipe, 3, 1, 2),
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
  const auto actions = pipeline_schedule(PipelineKind::one_f_one_b, 2, 1, 4);
  EXPECT_EQ(peak_activation_bytes(actions, stored), 13);  // one micro-batch and the next input
  EXPECT_EQ(peak_activation_bytes(sequential_schedule(4), stored), 10);
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(PipelineKind::gpipe, 2, 0, 4), stored), 40);
  // Recomputation: 4 bytes kept between forward and backward, 7 at most during either.
  const ActivationProfile recomputed{.received = 3, .forward_peak = 6, .kept = 4, .backward_peak = 7};
  EXPECT_EQ(peak_activation_bytes(sequential_schedule(4), recomputed), 7);
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(PipelineKind::gpipe, 2, 0, 4), recomputed),
            3 * 4 + 7);  // three micro-batches kept while the last one's backward runs
  // Stage 0 of two under 1F1B keeps two micro-batches: the second's forward peaks over the first.
  EXPECT_EQ(peak_activation_bytes(pipeline_schedule(PipelineKind::one_f_one_b, 2, 0, 4), recomputed),
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
