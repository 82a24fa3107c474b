// How a checkpoint lays the training state out in its file (DESIGN.md §2.5), shared by saving
// and loading: the three parts stored per tensor and their dataset names, the MPI-IO properties
// both use, and the per-dataset CRC-32 combined from every rank's owned runs.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/hdf5_handle.hpp"
#include "io/checkpoint.hpp"
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
// A rank's owned runs of one tensor: what it writes and checksums.
std::vector<const StateRun*> owned_runs_of(const std::vector<StateRun>& runs, int global_index);
// File access through MPI-IO over `comm`, metadata written collectively.
Hdf5Handle mpio_access(MPI_Comm comm);
// Independent data transfers (why: checkpoint_layout.cpp).
Hdf5Handle independent_transfer();
// CRC-32 of every dataset (index tensor x part_count + part) from the runs this rank owns,
// combined over all ranks. Collective over scope.world.
std::vector<std::uint32_t> dataset_checksums(const TrainingState& state, const CheckpointScope& scope);

}  // namespace mlptrain
