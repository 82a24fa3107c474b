// How a checkpoint lays the training state out in its file (DESIGN.md §2.5), shared by saving
// and loading: the three parts stored per tensor and their dataset names, the slices each rank
// writes, the per-dataset CRC-32 joined from every rank's slices, and the MPI-IO properties of
// loading.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/hdf5_handle.hpp"
#include "io/checkpoint_state.hpp"
#include "io/tensor_io.hpp"

namespace mlptrain {

// The three parts of the state stored per tensor.
inline constexpr int part_count = 3;
inline constexpr const char* part_prefixes[part_count] = {"/model/", "/optimizer/exp_avg/",
                                                          "/optimizer/exp_avg_sq/"};
// The model is stored as the fp32 masters: any precision resumes from any other.
inline constexpr RunField run_parts[part_count] = {RunField::master, RunField::exp_avg, RunField::exp_avg_sq};

std::string dataset_name(const ParameterTensor& tensor, int part);
std::string shape_text(const std::vector<std::int64_t>& shape);

// Slices, regrouping domains and datasets start on a page of the file where they can, so that
// their whole pages can be written around the page cache.
inline constexpr std::size_t page_bytes = 4096;
inline constexpr std::int64_t floats_per_page = page_bytes / sizeof(float);

// Where part `part` of `parts` splitting `elements` begins: an even share, rounded down to a
// page of elements (the last part ends at `elements`).
inline std::int64_t aligned_split(std::int64_t elements, int part, int parts) {
  return part == parts ? elements : elements * part / parts / floats_per_page * floats_per_page;
}

// A slice of a tensor that this rank writes: `count` elements from `offset` (flat, row-major in
// the whole tensor), which sit `run_skip` elements into `run`.
struct WrittenSlice {
  std::size_t tensor = 0;  // index into the scope's global tensors
  std::int64_t offset = 0;
  std::int64_t count = 0;
  const StateRange* run = nullptr;
  std::int64_t run_skip = 0;
};
// What this rank writes of every tensor (the same slices serve all three parts): of the runs it
// updates, its copy's share. The ranks holding runs alike split them in slices aligned to 4 KiB of
// their concatenation, so each element is written once and the writers share the bytes evenly.
std::vector<WrittenSlice> written_slices(const StatePlacement& placement,
                                         const std::vector<ParameterTensor>& global_tensors);
// A slice's elements of one part, as float32 in row-major order.
const float* slice_data(const WrittenSlice& slice, int part);

// The CRC-32 of each slice of each part (index part x slices + slice), read from `sources` (host
// memory, the same index) when given, else from the state's memory through `allocator`.
std::vector<std::uint32_t> slice_checksums(const std::vector<WrittenSlice>& slices,
                                           const std::vector<const float*>& sources, Allocator& allocator);
// How many elements of the slices' parts (read as slice_checksums reads them, from host memory)
// are not finite: a checkpoint is only ever published of finite numbers.
std::int64_t non_finite_elements(const std::vector<WrittenSlice>& slices, const std::vector<const float*>& sources);
// CRC-32 of every dataset (index tensor x part_count + part), joined from every rank's slices.
// Throws RuntimeFailure when the slices overlap or leave a gap. Collective over `world`.
std::vector<std::uint32_t> dataset_checksums(const std::vector<WrittenSlice>& slices,
                                             const std::vector<std::uint32_t>& slice_crcs,
                                             const std::vector<ParameterTensor>& global_tensors,
                                             Communicator& world);

// Checks, before a save writes anything, that every rank's slices together cover every dataset
// exactly once (the check dataset_checksums makes); throws RuntimeFailure. Collective.
void check_slices_cover(const std::vector<WrittenSlice>& slices, const std::vector<ParameterTensor>& global_tensors,
                        Communicator& world);

// File access through MPI-IO over `comm` (for loading).
Hdf5Handle mpio_access(MPI_Comm comm);
// Independent data transfers (why: checkpoint_layout.cpp).
Hdf5Handle independent_transfer();

}  // namespace mlptrain
