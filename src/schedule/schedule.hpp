// A step's work as data: the ordered actions one rank executes. Without a pipeline each
// micro-batch's forward is followed at once by its backward, so one micro-batch of activations is
// alive at a time. With one, every stage gets its own list, with the transfers to and from its
// neighbours placed among the computations; a CPU-only simulation of all stages' lists, with sends
// that complete only once their receive is posted, proves that every transfer pairs up and that
// no order of theirs can deadlock (tests/strategies).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace mlptrain {

enum class ActionKind {
  forward,
  backward,
  receive_activations,  // post the receive of a micro-batch's input from the previous stage
  send_activations,     // post the send of its output to the next stage
  receive_gradients,    // post the receive of d loss / d output from the next stage
  send_gradients,       // post the send of d loss / d input to the previous stage
};

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = 0;
  bool operator==(const Action&) const = default;
};

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

// The most micro-batches whose activations a list keeps alive at once (forward done, backward
// not yet).
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

// The most activation memory a list holds at once for micro-batches of that profile, whose
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
