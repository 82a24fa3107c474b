// A step's work as data: the ordered actions one rank executes. Without a pipeline each
// micro-batch's forward is followed at once by its backward, so one micro-batch of activations is
// alive at a time. With one, every stage gets its own list, with the transfers to and from its
// neighbours placed among the computations; a CPU-only simulation of all stages' lists, with sends
// that complete only once their receive is posted, proves that every transfer pairs up and that
// no order of theirs can deadlock (schedule_check.hpp).
// A stage may hold several model chunks (virtual stages): the layers split into P x V chunks,
// global chunk c on stage c mod P as the stage's local chunk c / P; an action names the local
// chunk it works on. A backward may run whole, or as two actions: B (the input gradient, which
// the previous chunk waits for) and W (the weight gradient, which nothing waits for).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace mlptrain {

enum class ActionKind {
  forward,
  backward,         // B and W together
  backward_input,   // B: d loss / d input, sent on at once
  backward_weight,  // W: d loss / d weights, deferred where a schedule likes
  receive_activations,  // post the receive of a micro-batch's input from the previous stage
  send_activations,     // post the send of its output to the next stage
  receive_gradients,    // post the receive of d loss / d output from the next stage
  send_gradients,       // post the send of d loss / d input to the previous stage
};

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = 0;
  int chunk = 0;  // the stage's local model chunk
  bool operator==(const Action&) const = default;
};

// The pipeline schedules as the literature names them: GPipe (Huang et al., 2019), 1F1B
// (PipeDream-Flush, Narayanan et al., 2021), Megatron-LM's interleaved 1F1B (Narayanan et al.,
// SC'21: V chunks per stage) and zero-bubble H1 (Qi et al., 2023: B and W apart, W deferred into
// the bubble, at 1F1B's activation memory).
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zero_bubble_h1 };
std::string_view schedule_kind_name(ScheduleKind kind);

struct PipelineShape {
  int stages = 1;
  int chunks = 1;  // per stage (interleaved: V; the others 1)
  int micro_batches = 1;
};

// Why a shape does not suit a schedule (empty when it does): interleaved needs P >= 2 and, with
// V >= 2, M a multiple of P (Megatron's rule: micro-batches go round the stages in groups of
// P); the other schedules hold one chunk per stage.
std::string schedule_shape_problem(ScheduleKind kind, const PipelineShape& shape);

// Stage `stage`'s list under `kind` (the shape must suit it), transfers placed as
// pipeline_schedule places them. Without training, the forward passes alone, chunk by chunk.
std::vector<Action> stage_schedule(ScheduleKind kind, const PipelineShape& shape, int stage, bool training = true);

// The most (chunk, micro-batch) pairs whose activations a stage keeps at once (forward done, the
// weight gradient not yet) by each schedule's theory: GPipe M; 1F1B min(M, P - s); ZB-H1
// min(M, P), 1F1B's peak (its first stage's) on every stage; interleaved with V >= 2
// min(MV, 2(P - s - 1) + (V - 1)P + 1), Megatron's warm-up plus one (with V = 1 it is 1F1B).
int theoretical_peak_in_flight(ScheduleKind kind, const PipelineShape& shape, int stage);

std::string_view action_name(ActionKind kind);

std::vector<Action> sequential_schedule(int micro_batches);
// Forward passes only (evaluation), in micro-batch order.
std::vector<Action> forward_only_schedule(int micro_batches);

// Stage `stage` of `stages`: the computations in the kind's order, each receive posted one
// computation ahead of the one that needs it (so the transfer overlaps the computation before),
// each send right after the computation that produced its data. Backward passes run in
// micro-batch order under both kinds, so gradients accumulate in the same order as without a
// pipeline. Without training, the forward passes alone.
std::vector<Action> pipeline_schedule(PipelineKind kind, int stages, int stage, int micro_batches,
                                      bool training = true);

// Forwards 1F1B runs at `stage` before its first backward, beyond the one it pairs with it.
int one_f_one_b_warmup(int stages, int stage, int micro_batches);

// The most (chunk, micro-batch) pairs whose activations a list keeps alive at once (forward
// done, its whole backward or its W not yet).
int peak_micro_batches_in_flight(const std::vector<Action>& actions);

// Activation bytes over one training micro-batch: what arrives with it (the input, and the
// targets where the loss is computed), the most alive during its forward, what it keeps from the
// end of its forward until its backward, and the most alive during its backward.
struct ActivationProfile {
  std::int64_t received = 0;
  std::int64_t forward_peak = 0;
  std::int64_t kept = 0;
  std::int64_t backward_peak = 0;
};

// The most activation memory a list holds at once for micro-batches of that profile (a list whose
// backwards run whole, on one chunk), whose
// received bytes are allocated before the forward when the input comes from the previous stage.
std::int64_t peak_activation_bytes(const std::vector<Action>& actions, const ActivationProfile& profile);

// The layers [first, last) a rank runs.
struct LayerRange {
  int first = 0;
  int last = 0;
};

// Contiguous layer ranges for `stages` stages (at least one layer each) that minimize the
// largest stage's total cost, from the layers' costs.
std::vector<LayerRange> balanced_stages(const std::vector<std::int64_t>& layer_costs, int stages);

}  // namespace mlptrain
