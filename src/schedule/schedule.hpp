// A step's work as data: the ordered actions one rank executes. Without a pipeline each
// micro-batch's forward is followed at once by its backward, so one micro-batch of activations is
// alive at a time. With one, every stage gets its own list, with the transfers to and from its
// neighbours placed among the computations; a CPU-only simulation of all stages' lists, with sends
// that complete only once their receive is posted, proves that every transfer pairs up and that
// no order of theirs can deadlock (schedule_check.hpp).
// A stage may hold several model chunks (virtual stages): the layers split into P x V chunks,
// placed in a loop (global chunk c on stage c mod P as the stage's local chunk c / P) or, two a
// stage, in a V (stage s holds chunks s and 2P - 1 - s, so the first and the last layers are both
// on stage 0, and the boundary between chunks P - 1 and P stays on stage P - 1); an action names
// the local chunk it works on. A backward may run whole, or as two actions: B (the input gradient, which
// the previous chunk waits for) and W (the weight gradient, which nothing waits for).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>


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

enum class ChunkPlacement { looped, v_shape };

struct PipelineShape {
  int stages = 1;
  int chunks = 1;  // per stage (interleaved: V; ZB-V: 2; the others 1)
  int micro_batches = 1;
  ChunkPlacement placement = ChunkPlacement::looped;
};

// The global chunk a stage's local chunk is, and the stage a global chunk is on.
int global_chunk(const PipelineShape& shape, int stage, int local_chunk);
int stage_of_chunk(const PipelineShape& shape, int global);

std::string_view action_name(ActionKind kind);

std::vector<Action> sequential_schedule(int micro_batches);
// Forward passes only (evaluation), in micro-batch order.
std::vector<Action> forward_only_schedule(int micro_batches);

// The most (chunk, micro-batch) pairs whose activations a list keeps alive at once (forward
// done, its whole backward or its W not yet).
int peak_micro_batches_in_flight(const std::vector<Action>& actions);

// Activation bytes over one training micro-batch: what arrives with it (the input, and the
// targets where the loss is computed), the most alive during its forward, what it keeps from the
// end of its forward until its backward, and the most alive during its backward.
// A backward split into B and W keeps `kept_for_weights` from B (which allocates and frees
// nothing else) until W frees it all.
struct ActivationProfile {
  std::int64_t received = 0;
  std::int64_t forward_peak = 0;
  std::int64_t kept = 0;
  std::int64_t backward_peak = 0;
  std::int64_t kept_for_weights = 0;
};

// The most activation memory a list holds at once for micro-batches of each chunk's profile
// (indexed by the actions' chunks), whose received bytes are allocated before the forward when
// the input comes from the previous chunk.
std::int64_t peak_activation_bytes(const std::vector<Action>& actions, const std::vector<ActivationProfile>& profiles);
inline std::int64_t peak_activation_bytes(const std::vector<Action>& actions, const ActivationProfile& profile) {
  return peak_activation_bytes(actions, std::vector<ActivationProfile>{profile});
}

// The layers [first, last) of one model chunk.
struct LayerRange {
  int first = 0;
  int last = 0;
  int count() const { return last - first; }
  bool contains(int layer) const { return layer >= first && layer < last; }
};

// The layers a rank runs: its model chunks in local order (ascending layers; one chunk without
// virtual stages). Its "local" layers are these in order, numbered from 0 across the chunks.
struct RankLayers {
  std::vector<LayerRange> chunks;

  int count() const;
  bool contains(int layer) const;
  // The chunk holding `layer` (-1: none), and where the layer stands among the local layers.
  int chunk_of(int layer) const;
  int local_index(int layer) const;
  // Both held, in one chunk: the output of one is the input of the other on this rank.
  bool same_chunk(int layer, int other) const { return contains(layer) && chunk_of(layer) == chunk_of(other); }
  std::vector<int> list() const;  // the layers in local order
};

// Contiguous layer ranges for `stages` stages (at least one layer each) that minimize the
// largest stage's total cost, from the layers' costs.
std::vector<LayerRange> balanced_stages(const std::vector<std::int64_t>& layer_costs, int stages);

// Stage `stage`'s chunks when the layers split into stages x chunks balanced ranges, placed as
// the shape says (looped: Megatron-LM's placement of virtual stages; or in a V).
RankLayers stage_chunks(const std::vector<std::int64_t>& layer_costs, const PipelineShape& shape, int stage);

}  // namespace mlptrain
