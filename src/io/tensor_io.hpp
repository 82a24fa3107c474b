// Moving one tensor's runs between a rank's memory and an HDF5 dataset of the whole tensor: each
// run (a flat row-major range) becomes a few hyperslabs of the dataset, their union is this rank's
// selection, and the data moves in one collective transfer, through a host staging buffer when the
// runs are not one contiguous piece of host memory (`allocator` says where they are, and copies).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <vector>

#include "core/buffer.hpp"
#include "model/state_runs.hpp"

namespace mlptrain {

struct Hyperslab {
  std::vector<hsize_t> start;
  std::vector<hsize_t> count;
};

// The boxes that make up the flat range [offset, offset + count) of an array of `shape`, in
// row-major order: at most two per dimension.
std::vector<Hyperslab> hyperslabs_of_range(const std::vector<std::int64_t>& shape,
                                           std::int64_t offset, std::int64_t count);

// Which part of a run moves: its values or one of its AdamW moments.
using RunPart = float* StateRun::*;

// Collective (every rank calls it for the same dataset; a rank without runs passes none).
bool write_runs(hid_t dataset, hid_t transfer, const std::vector<const StateRun*>& runs,
                RunPart part, Allocator& allocator);
bool read_runs(hid_t dataset, hid_t transfer, const std::vector<const StateRun*>& runs,
               RunPart part, Allocator& allocator);

}  // namespace mlptrain
