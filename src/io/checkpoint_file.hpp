// The checkpoint file's frame, made by one rank: the HDF5 file with every dataset allocated
// (contiguous, 4 KiB-aligned, not filled) and every attribute written, so that the ranks can then
// write their slices' bytes straight to the datasets' offsets without the HDF5 library (which is
// not thread-safe) while training goes on; the checksums, known once the writers have read the
// bytes, written into it afterwards; and putting a whole file in place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "io/checkpoint_state.hpp"

namespace mlptrain {

// Creates `path` (replacing any file there) and returns every dataset's byte offset in it (index
// tensor x part_count + part). Every dataset's crc32 attribute holds 0 until
// write_checkpoint_checksums. Throws RuntimeFailure naming the file when it cannot be made.
std::vector<std::uint64_t> create_checkpoint_file(const std::filesystem::path& path, const TrainingState& state,
                                                  const CheckpointDescription& description,
                                                  const std::vector<ParameterTensor>& global_tensors);

// Writes every dataset's crc32 attribute (index tensor x part_count + part) into the frame at
// `path`, durably. Throws RuntimeFailure naming the file when it cannot.
void write_checkpoint_checksums(const std::filesystem::path& path, const std::vector<ParameterTensor>& global_tensors,
                                const std::vector<std::uint32_t>& checksums);

// Renames a whole file (its bytes already durable) to `final_path`, then points `latest` in its
// directory at it, durably. Throws RuntimeFailure naming what could not be done.
void publish_checkpoint(const std::filesystem::path& temporary, const std::filesystem::path& final_path);

}  // namespace mlptrain
