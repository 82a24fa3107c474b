// Regrouping a checkpoint's short slices before they are written (two-phase I/O, as ROMIO's
// collective buffering does it). A tensor-parallel rank's column block is a run per row: written
// as they are, its slices reach the file as thousands of writes of a row piece each. Where any
// rank's slices of a tensor average under 256 KiB, the ranks agree to regroup that tensor: each
// takes a contiguous domain of it (4 KiB-aligned, one per rank), receives that domain's elements
// from the ranks holding them (one all-to-all per save), and writes the domain as one piece.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"
#include "io/checkpoint_layout.hpp"

namespace mlptrain {

// The slices a rank writes once regrouped: its own slices of the tensors left as they are
// (`kept`), and its domains of the regrouped ones (no run behind them: their elements arrive).
// Host memory a save's regrouping packs into and receives into, kept from save to save: fresh
// pages cost more than the copies.
struct RegroupBuffers {
  std::vector<float> send, receive;
};

struct RegroupPlan {
  std::vector<WrittenSlice> kept;
  std::vector<WrittenSlice> domains;
  std::vector<WrittenSlice> sent;  // this rank's slices of the regrouped tensors, to be sent
};

// Decides which tensors to regroup (agreed over `world`) and this rank's domains. Collective.
RegroupPlan plan_regroup(const std::vector<WrittenSlice>& slices,
                         const std::vector<ParameterTensor>& global_tensors, Communicator& world);

// Sends every part of `plan.sent` to the domains' ranks and fills `domain_data` (per part and
// domain, index part x domains + domain: host memory of the domain's count) with what arrives.
// Collective over `world`.
void regroup(const RegroupPlan& plan, const std::vector<ParameterTensor>& global_tensors,
             const std::vector<float*>& domain_data, RegroupBuffers& buffers, Allocator& allocator,
             Communicator& world);

}  // namespace mlptrain
