// The layouts of a world the planner may rank (--layouts all): every data x tensor x pipeline
// split of the ranks, expert parallelism inside the data-parallel group, ZeRO stages 0-3 (sharded
// over the whole data-parallel group, and hybrid: over the data-parallel ranks of one node, where
// they are fewer), each pipeline schedule (interleaved with model chunks per stage from a list),
// micro-batch counts from a list, recomputation on and
// off, sequence parallelism on and off with tensor parallelism, and offload on and off where the
// device has a host to offload to; each kept only where the trainer's own validation accepts
// it, so a layout the planner ranks is one mlptrain would run.
#pragma once

#include <vector>

#include "core/config.hpp"

namespace mlptrain {

// Lists of values --layouts all tries for options that are not a split of the ranks.
struct LayoutChoices {
  std::vector<int> micro_batches;
  std::vector<int> virtual_stages;  // interleaved's model chunks per stage (each >= 2)
};

// The validated layouts of `world` ranks in nodes of `ranks_per_node`, every other option as in
// `base`.
std::vector<Config> every_layout(const Config& base, int world, int ranks_per_node, const LayoutChoices& choices);

}  // namespace mlptrain
