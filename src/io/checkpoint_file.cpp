// The checkpoint file's frame and its publication (see checkpoint_file.hpp).
#include "io/checkpoint_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "io/checkpoint_layout.hpp"
#include "io/hdf5_attributes.hpp"

namespace mlptrain {

namespace fs = std::filesystem;

std::vector<std::uint64_t> create_checkpoint_file(const fs::path& path, const TrainingState& state,
                                                  const CheckpointDescription& description,
                                                  const std::vector<ParameterTensor>& global_tensors) {
  const auto failed = [&] { return RuntimeFailure("checkpoint: cannot create '" + path.string() + "'"); };
  // Datasets of 4 KiB or more start on a 4 KiB boundary: the slices' writes then fill whole pages.
  Hdf5Handle access = property_handle(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_alignment(access.get(), page_bytes, page_bytes);
  Hdf5Handle file = file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
  if (!file.valid()) throw failed();
  Hdf5Handle links = property_handle(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(links.get(), 1);
  // Space for every element now (so each has an offset), never filled: the ranks write them all.
  Hdf5Handle creation = property_handle(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(creation.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(creation.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(creation.get(), H5D_FILL_TIME_NEVER);
  std::vector<std::uint64_t> offsets;
  bool written = true;
  for (std::size_t index = 0; index < global_tensors.size(); ++index) {
    const ParameterTensor& global = global_tensors[index];
    const std::vector<hsize_t> dims(global.global_shape.begin(), global.global_shape.end());
    for (int part = 0; part < part_count; ++part) {
      Hdf5Handle file_space = dataspace_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
      Hdf5Handle dataset = dataset_handle(H5Dcreate2(file.get(), dataset_name(global, part).c_str(), H5T_IEEE_F32LE,
                                                     file_space.get(), links.get(), creation.get(), H5P_DEFAULT));
      const haddr_t offset = dataset.valid() ? H5Dget_offset(dataset.get()) : HADDR_UNDEF;
      if (offset == HADDR_UNDEF) throw failed();
      offsets.push_back(offset);
      written = write_uint32_attribute(dataset.get(), "crc32", 0) && written;  // its place, for the checksum
    }
  }
  const hid_t root = file.get();
  written = write_string_attribute(root, "format", checkpoint_format) && written;
  written = write_int64_attribute(root, "format_version", checkpoint_format_version) && written;
  written = write_int64_attribute(root, "step", state.step) && written;
  written = write_int64_attribute(root, "data_position", state.data_position) && written;
  written = write_string_attribute(root, "config", description.config_ini) && written;
  written = write_string_attribute(root, "layout", description.layout) && written;
  written = write_int64_attribute(root, "seed", description.seed) && written;
  const Precision& precision = state.placement.precision;
  written = write_string_attribute(root, "param_dtype", std::string(data_type_name(precision.param))) && written;
  written = write_string_attribute(root, "reduce_dtype", std::string(data_type_name(precision.reduce))) && written;
  Hdf5Handle optimizer = group_handle(H5Gopen2(root, "/optimizer", H5P_DEFAULT));
  written = write_int64_attribute(optimizer.get(), "step", state.optimizer_step) && written;
  if (state.loss_scale > 0)
    written = write_double_attribute(optimizer.get(), "loss_scale", state.loss_scale) &&
              write_int64_attribute(optimizer.get(), "loss_scale_finite_steps", state.loss_scale_finite_steps) &&
              written;
  optimizer.close();
  if (!file.close() || !written) throw failed();
  return offsets;
}

namespace {

void sync_path(const fs::path& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY);
  if (descriptor >= 0) {
    ::fsync(descriptor);
    ::close(descriptor);
  }
}

}  // namespace

void write_checkpoint_checksums(const fs::path& path, const std::vector<ParameterTensor>& global_tensors,
                                const std::vector<std::uint32_t>& checksums) {
  const auto failed = [&] { return RuntimeFailure("checkpoint: cannot write the checksums into '" + path.string() + "'"); };
  Hdf5Handle file = file_handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (!file.valid()) throw failed();
  bool written = true;
  for (std::size_t index = 0; index < global_tensors.size(); ++index)
    for (int part = 0; part < part_count; ++part) {
      Hdf5Handle dataset = dataset_handle(H5Dopen2(file.get(), dataset_name(global_tensors[index], part).c_str(), H5P_DEFAULT));
      written = dataset.valid() &&
                write_uint32_attribute(dataset.get(), "crc32", checksums[index * part_count + part]) && written;
    }
  if (!file.close() || !written) throw failed();
  sync_path(path);
}

void publish_checkpoint(const fs::path& temporary, const fs::path& final_path) {
  std::error_code error;
  fs::rename(temporary, final_path, error);
  if (error) throw RuntimeFailure("checkpoint: cannot rename into '" + final_path.string() + "'");
  const fs::path directory = final_path.parent_path();
  const fs::path latest_temporary = directory / ".latest.partial";
  // A `latest` that could not be written leaves no partial one behind.
  const auto fail = [&](const std::string& message) {
    fs::remove(latest_temporary, error);
    throw RuntimeFailure(message);
  };
  {
    std::ofstream latest(latest_temporary, std::ios::trunc);
    latest << final_path.filename().string() << '\n';
    latest.flush();
    if (!latest) fail("checkpoint: cannot write '" + latest_temporary.string() + "'");
  }
  sync_path(latest_temporary);
  fs::rename(latest_temporary, directory / "latest", error);
  if (error) fail("checkpoint: cannot update '" + (directory / "latest").string() + "'");
  sync_path(directory);
}

}  // namespace mlptrain
