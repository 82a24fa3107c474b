// Simulations of a pipeline's lists (see schedule_check.hpp).
#include "schedule/schedule_check.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <numeric>
#include <tuple>

namespace mlptrain {

namespace {

// A transfer across the boundary after global chunk `boundary`: activations go from its stage to
// the next chunk's, gradients back.
using Message = std::tuple<bool /*activations*/, int /*micro-batch*/, int /*boundary*/>;
// A chunk's computation: (local chunk, micro-batch).
using Work = std::pair<int, int>;

bool whole_or_input(ActionKind kind) { return kind == ActionKind::backward || kind == ActionKind::backward_input; }
bool computes(ActionKind kind) {
  return kind == ActionKind::forward || whole_or_input(kind) || kind == ActionKind::backward_weight;
}

class Simulation {
 public:
  Simulation(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape, bool training)
      : lists_(lists), shape_(shape), training_(training), stages_(static_cast<int>(lists.size())),
        next_(lists.size(), 0), forwards_(lists.size()), inputs_(lists.size()), weights_(lists.size()) {}

  std::string run() {
    if (stages_ != shape_.stages) return "one list per stage is needed";
    bool progressed = true;
    while (progressed && problem_.empty()) {
      progressed = false;
      for (int stage = 0; stage < stages_ && problem_.empty(); ++stage) {
        const auto& list = lists_[static_cast<std::size_t>(stage)];
        auto& at = next_[static_cast<std::size_t>(stage)];
        while (problem_.empty() && at < list.size() && ready(stage, list[at]) && (training_ || sends_complete(stage))) {
          perform(stage, list[at]);
          ++at;
          progressed = true;
        }
      }
    }
    if (!problem_.empty()) return problem_;
    for (int stage = 0; stage < stages_; ++stage)
      if (next_[static_cast<std::size_t>(stage)] < lists_[static_cast<std::size_t>(stage)].size() || !sends_complete(stage))
        return fmt::format("deadlock: stage {} waits at action {}", stage, next_[static_cast<std::size_t>(stage)]);
    return coverage();
  }

 private:
  int global(int stage, const Action& action) const { return global_chunk(shape_, stage, action.chunk); }
  int last_chunk() const { return shape_.stages * shape_.chunks - 1; }
  int sender(const Message& message) const {
    const int boundary = std::get<2>(message);
    return stage_of_chunk(shape_, std::get<0>(message) ? boundary : boundary + 1);
  }
  int count(const std::map<Message, int>& posts, const Message& message) const {
    const auto found = posts.find(message);
    return found == posts.end() ? 0 : found->second;
  }
  bool arrived(const Message& message) const { return count(received_, message) > 0 && count(sent_, message) > 0; }
  bool has(const std::vector<std::vector<Work>>& done, int stage, const Action& action) const {
    const auto& list = done[static_cast<std::size_t>(stage)];
    return std::find(list.begin(), list.end(), Work{action.chunk, action.micro_batch}) != list.end();
  }

  bool ready(int stage, const Action& action) const {
    const int chunk = global(stage, action), micro_batch = action.micro_batch;
    // A new transfer buffer waits for the chunk's earlier gradient sends (theirs are freed).
    if ((action.kind == ActionKind::receive_gradients || whole_or_input(action.kind)) &&
        !gradient_sends_complete(chunk))
      return false;
    if (action.kind == ActionKind::forward) return chunk == 0 || arrived({true, micro_batch, chunk - 1});
    if (whole_or_input(action.kind)) {
      if (chunk == last_chunk()) return true;
      const Message output{true, micro_batch, chunk};  // its activation send must complete
      if (count(sent_, output) > 0 && count(received_, output) == 0) return false;
      return arrived({false, micro_batch, chunk});
    }
    return true;
  }

  void perform(int stage, const Action& action) {
    const int chunk = global(stage, action), micro_batch = action.micro_batch;
    const Work work{action.chunk, micro_batch};
    if (action.chunk < 0 || action.chunk >= shape_.chunks) {
      problem_ = fmt::format("stage {} names chunk {} of {}", stage, action.chunk, shape_.chunks);
      return;
    }
    switch (action.kind) {
      case ActionKind::forward: forwards_[static_cast<std::size_t>(stage)].push_back(work); return;
      case ActionKind::backward:
      case ActionKind::backward_input:
        if (!has(forwards_, stage, action))
          problem_ = fmt::format("stage {} runs backward {} (chunk {}) before its forward", stage, micro_batch, action.chunk);
        inputs_[static_cast<std::size_t>(stage)].push_back(work);
        if (action.kind == ActionKind::backward) weights_[static_cast<std::size_t>(stage)].push_back(work);
        return;
      case ActionKind::backward_weight:
        if (!has(inputs_, stage, action))
          problem_ = fmt::format("stage {} runs W {} (chunk {}) before its B", stage, micro_batch, action.chunk);
        weights_[static_cast<std::size_t>(stage)].push_back(work);
        return;
      case ActionKind::send_activations:
      case ActionKind::send_gradients: {
        const bool activations = action.kind == ActionKind::send_activations;
        if (activations ? chunk == last_chunk() : chunk == 0) {
          problem_ = fmt::format("stage {} sends beyond the model's chunks", stage);
          return;
        }
        if (!has(activations ? forwards_ : inputs_, stage, action))
          problem_ = fmt::format("stage {} sends micro-batch {} before computing it", stage, micro_batch);
        ++sent_[{activations, micro_batch, activations ? chunk : chunk - 1}];
        return;
      }
      case ActionKind::receive_activations:
      case ActionKind::receive_gradients: {
        const bool activations = action.kind == ActionKind::receive_activations;
        if (activations ? chunk == 0 : chunk == last_chunk()) {
          problem_ = fmt::format("stage {} receives from beyond the model's chunks", stage);
          return;
        }
        ++received_[{activations, micro_batch, activations ? chunk - 1 : chunk}];
        return;
      }
    }
  }

  // A stage's list is over once each of its sends has its receive posted (and, evaluating,
  // each send is waited for as soon as it is posted).
  bool sends_complete(int stage) const {
    for (const auto& [message, posts] : sent_)
      if (sender(message) == stage && count(received_, message) == 0) return false;
    return true;
  }
  // Every gradient send of the model's chunk `chunk` has its receive posted.
  bool gradient_sends_complete(int chunk) const {
    for (const auto& [message, posts] : sent_)
      if (!std::get<0>(message) && std::get<2>(message) == chunk - 1 && count(received_, message) == 0) return false;
    return true;
  }

  std::string coverage() const {
    for (const auto& [message, posts] : sent_)
      if (posts != 1 || count(received_, message) != 1) return "a send without exactly one matching receive";
    for (const auto& [message, posts] : received_)
      if (posts != 1 || count(sent_, message) != 1) return "a receive without exactly one matching send";
    std::vector<Work> every;
    for (int chunk = 0; chunk < shape_.chunks; ++chunk)
      for (int micro_batch = 0; micro_batch < shape_.micro_batches; ++micro_batch) every.push_back({chunk, micro_batch});
    for (int stage = 0; stage < stages_; ++stage) {
      const auto index = static_cast<std::size_t>(stage);
      for (const auto* done : {&forwards_[index], &inputs_[index], &weights_[index]}) {
        if (!training_ && done != &forwards_[index]) continue;
        std::vector<Work> sorted = *done;
        std::sort(sorted.begin(), sorted.end());
        if (sorted != every) return fmt::format("stage {} does not run every (chunk, micro-batch) once", stage);
      }
      // Weight gradients accumulate per chunk in micro-batch order, as one process's do.
      std::vector<int> last(static_cast<std::size_t>(shape_.chunks), -1);
      for (const auto& [chunk, micro_batch] : weights_[index]) {
        if (micro_batch < last[static_cast<std::size_t>(chunk)])
          return fmt::format("stage {} takes chunk {}'s weight gradients out of micro-batch order", stage, chunk);
        last[static_cast<std::size_t>(chunk)] = micro_batch;
      }
    }
    return {};
  }

  const std::vector<std::vector<Action>>& lists_;
  const PipelineShape shape_;
  const bool training_;
  const int stages_;
  std::vector<std::size_t> next_;
  std::vector<std::vector<Work>> forwards_, inputs_, weights_;  // per stage, in order
  std::map<Message, int> sent_, received_;                      // posted so far
  std::string problem_;
};

}  // namespace

std::string check_schedule(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape, bool training) {
  return Simulation(lists, shape, training).run();
}

std::vector<std::vector<Action>> all_stage_schedules(const ScheduleEntry& schedule, const PipelineShape& shape,
                                                     bool training) {
  std::vector<std::vector<Action>> lists;
  for (int stage = 0; stage < shape.stages; ++stage) lists.push_back(stage_schedule(schedule, shape, stage, training));
  return lists;
}

double Timeline::bubble_fraction() const {
  const double total = makespan * static_cast<double>(busy.size());
  return total > 0 ? 1.0 - std::accumulate(busy.begin(), busy.end(), 0.0) / total : 0.0;
}

Timeline schedule_timeline(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape,
                           const ComputeTimes& times) {
  const std::vector<ComputeTimes> stage(static_cast<std::size_t>(shape.chunks), times);
  return schedule_timeline(lists, shape, std::vector<std::vector<ComputeTimes>>(static_cast<std::size_t>(shape.stages), stage));
}

Timeline schedule_timeline(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape,
                           const std::vector<std::vector<ComputeTimes>>& chunk_times) {
  const int stages = shape.stages, chunks_total = shape.stages * shape.chunks;
  // End times by (kind, global chunk, micro-batch); the input gradient's end stands for a whole
  // backward's too.
  std::map<std::tuple<int, int, int>, double> ended;
  const auto end_of = [&](int kind, int chunk, int micro_batch) -> const double* {
    const auto found = ended.find({kind, chunk, micro_batch});
    return found == ended.end() ? nullptr : &found->second;
  };
  constexpr int forward = 0, input = 1;
  const double start_of_step = 0.0;
  Timeline timeline{.busy = std::vector<double>(static_cast<std::size_t>(stages), 0.0)};
  std::vector<double> free_at(static_cast<std::size_t>(stages), 0.0);
  std::vector<std::size_t> next(lists.size(), 0);
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int stage = 0; stage < stages; ++stage) {
      const auto index = static_cast<std::size_t>(stage);
      while (next[index] < lists[index].size()) {
        const Action& action = lists[index][next[index]];
        if (!computes(action.kind)) {
          ++next[index];
          continue;
        }
        const int chunk = global_chunk(shape, stage, action.chunk), micro_batch = action.micro_batch;
        const ComputeTimes& times = chunk_times.at(index).at(static_cast<std::size_t>(action.chunk));
        const double* input_end = nullptr;
        double duration = times.forward;
        if (action.kind == ActionKind::forward) {
          input_end = chunk == 0 ? &start_of_step : end_of(forward, chunk - 1, micro_batch);
        } else if (whole_or_input(action.kind)) {
          input_end = chunk + 1 == chunks_total ? end_of(forward, chunk, micro_batch) : end_of(input, chunk + 1, micro_batch);
          duration = times.backward_input + (action.kind == ActionKind::backward ? times.backward_weight : 0.0);
        } else {
          input_end = end_of(input, chunk, micro_batch);
          duration = times.backward_weight;
        }
        if (input_end == nullptr) break;  // waits for another stage
        const double start = std::max(free_at[index], *input_end);
        free_at[index] = start + duration;
        timeline.busy[index] += duration;
        timeline.makespan = std::max(timeline.makespan, free_at[index]);
        // A whole backward's input gradient is ready when it ends (its W comes within it).
        if (action.kind != ActionKind::backward_weight)
          ended[{action.kind == ActionKind::forward ? forward : input, chunk, micro_batch}] = free_at[index];
        ++next[index];
        progressed = true;
      }
    }
  }
  return timeline;
}

}  // namespace mlptrain
