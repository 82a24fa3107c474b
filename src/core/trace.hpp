// A rank's timeline for a Chrome trace (--trace): spans of computation, transfers and collectives,
// each with the step and micro-batch it belongs to. Recording appends to a vector that stops
// growing at its capacity (so a long run cannot exhaust memory through its trace); the trainer
// writes the spans of every rank into one file at the end (report/trace_file.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/data_type.hpp"

namespace mlptrain {

// The rows of a rank in the trace viewer. Computations follow one another; transfers and
// collectives are non-blocking and overlap, so the trace shows them as asynchronous spans, from
// posting to the moment their completion was noticed (tested or waited for): an upper bound on
// their time in flight, not the time the network took. Storage holds a checkpoint's writes, which
// go on behind the steps.
enum class TraceTrack : int { compute = 0, transfers = 1, collectives = 2, storage = 3 };

struct TraceSpan {
  std::string name;  // "forward", "backward", "optimizer", "checkpoint", or an operation's name
  TraceTrack track = TraceTrack::compute;
  double start_ms = 0;  // on the clock of core/timer.hpp
  double end_ms = 0;
  std::int64_t step = -1;  // the optimizer step (0-based) it belongs to; -1: the recorder's
  int micro_batch = -1;
  int chunk = -1;  // the stage's local model chunk of a computation (-1: not one)
  std::int64_t bytes = 0;
  std::string group;  // process group of a transfer or collective
  DataType type = DataType::float32;  // its elements' type
};

class TraceRecorder {
 public:
  explicit TraceRecorder(std::size_t capacity = 250'000) : capacity_(capacity) {}

  // Spans recorded from now on without a step of their own belong to `step`.
  void set_step(std::int64_t step) { step_ = step; }
  void record(TraceSpan span) {
    if (spans_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    if (span.step < 0) span.step = step_;
    spans_.push_back(std::move(span));
  }

  const std::vector<TraceSpan>& spans() const { return spans_; }
  std::size_t dropped() const { return dropped_; }

 private:
  std::size_t capacity_;
  std::vector<TraceSpan> spans_;
  std::size_t dropped_ = 0;
  std::int64_t step_ = -1;
};

// Records a span of computation, if there is a trace.
inline void record_span(TraceRecorder* trace, std::string name, double start_ms, double end_ms,
                        int micro_batch = -1, int chunk = -1) {
  if (trace != nullptr)
    trace->record({.name = std::move(name),
                   .start_ms = start_ms,
                   .end_ms = end_ms,
                   .micro_batch = micro_batch,
                   .chunk = chunk});
}

}  // namespace mlptrain
