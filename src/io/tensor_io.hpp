// Reading one tensor's runs from an HDF5 dataset of the whole tensor into a rank's memory: each
// run (a flat row-major range) becomes a few hyperslabs of the dataset, their union is this rank's
// selection, and the data moves in one transfer, through a host staging buffer when the
// runs are not one contiguous piece of host memory (`allocator` says where they are, and copies).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <vector>

#include "core/buffer.hpp"
#include "model/state_ranges.hpp"

namespace mlptrain {

struct Hyperslab {
  std::vector<hsize_t> start;
  std::vector<hsize_t> count;
};

// The boxes that make up the flat range [offset, offset + count) of an array of `shape`, in
// row-major order: at most two per dimension.
std::vector<Hyperslab> hyperslabs_of_range(const std::vector<std::int64_t>& shape,
                                           std::int64_t offset, std::int64_t count);

// Which part of a run moves: its fp32 master weights or AdamW moments, or its values (of the
// param type: a 16-bit one is rounded from the file's float32 on the way in).
enum class RunField { values, master, exp_avg, exp_avg_sq };
void* field_of(const StateRange& run, RunField field);

// Collective (every rank calls it for the same dataset; a rank without runs passes none). The
// dataset holds float32; `type` is the field's element type in memory (values may be of a 16-bit
// type, rounded from the file's float32).
bool read_runs(hid_t dataset, hid_t transfer, const std::vector<const StateRange*>& runs, RunField field,
               DataType type, Allocator& allocator);

}  // namespace mlptrain
