// Checkpoint loading (see checkpoint.hpp). Every HDF5 call that opens an object is made by all
// ranks in the same order (parallel HDF5 requires it for metadata); data moves with independent
// transfers of the runs each rank needs. Problems are agreed on across ranks before the next
// collective, so a bad file fails everywhere alike.
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "comm/consensus.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_layout.hpp"
#include "io/hdf5_attributes.hpp"
#include "io/stored_config.hpp"
#include "io/tensor_io.hpp"

namespace mlptrain {

namespace fs = std::filesystem;

namespace {

fs::path resolve_checkpoint(const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error)) throw UsageError("--resume: no such file or directory '" + path + "'");
  if (!fs::is_directory(path, error)) return path;
  std::ifstream latest(fs::path(path) / "latest");
  std::string name;
  if (!(latest >> name)) throw UsageError("--resume: directory '" + path + "' has no 'latest' file");
  const fs::path file = fs::path(path) / name;
  if (!fs::exists(file, error))
    throw UsageError("--resume: '" + path + "/latest' names missing file '" + name + "'");
  return file;
}

std::int64_t count_links(hid_t file, const char* group_name) {
  if (H5Lexists(file, "/model", H5P_DEFAULT) <= 0 || H5Lexists(file, group_name, H5P_DEFAULT) <= 0)
    return -1;
  Hdf5Handle group = group_handle(H5Gopen2(file, group_name, H5P_DEFAULT));
  H5G_info_t info;
  if (!group.valid() || H5Gget_info(group.get(), &info) < 0) return -1;
  return static_cast<std::int64_t>(info.nlinks);
}

// The shape of a dataset, or empty when it does not exist.
std::vector<std::int64_t> dataset_shape(hid_t file, const std::string& name) {
  // H5Lexists needs every parent to exist, so walk the path.
  for (std::size_t slash = name.find('/', 1); slash != std::string::npos;
       slash = name.find('/', slash + 1))
    if (H5Lexists(file, name.substr(0, slash).c_str(), H5P_DEFAULT) <= 0) return {};
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) return {};
  Hdf5Handle dataset = dataset_handle(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  if (!dataset.valid()) return {};
  Hdf5Handle space = dataspace_handle(H5Dget_space(dataset.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

}  // namespace

std::string load_checkpoint(const std::string& path, TrainingState& state,
                            const CheckpointScope& scope) {
  fs::path file_path;
  agree_or_throw(scope.world, [&] {
    file_path = resolve_checkpoint(path);
    if (H5Fis_hdf5(file_path.c_str()) <= 0)
      throw UsageError("--resume: '" + file_path.string() + "' is not an HDF5 file");
  });
  const std::string where = "--resume: '" + file_path.string() + "'";
  // When the checkpoint does not fit: the options it was written with that this run changed.
  const auto differing = [&](hid_t file) {
    const std::string options = differing_options(read_string_attribute(file, "config").value_or(""),
                                                  scope.config_ini, scope.shape_options);
    return options.empty() ? std::string() : " (written with " + options + ")";
  };
  Hdf5Handle access = mpio_access(scope.mpi_comm);
  Hdf5Handle file = file_handle(H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, access.get()));
  std::vector<std::uint32_t> stored_checksums;
  agree_or_throw(scope.world, [&] {
    if (!file.valid()) throw UsageError(where + " cannot be opened (corrupted?)");
    if (read_string_attribute(file.get(), "format") != std::string(checkpoint_format))
      throw UsageError(where + " is not an mlptrain checkpoint (no format attribute)");
    const auto version = read_int64_attribute(file.get(), "format_version");
    if (!version || *version < 1 || *version > checkpoint_format_version)
      throw UsageError(where + " has unsupported format_version " +
                       (version ? std::to_string(*version) : std::string("(missing)")));
    const auto step = read_int64_attribute(file.get(), "step");
    if (!step || *step < 0) throw UsageError(where + " has no valid step attribute");
    state.step = *step;
    const auto position = read_int64_attribute(file.get(), "data_position");
    if (!position || *position < 0) throw UsageError(where + " has no valid data_position attribute");
    state.data_position = *position;
    Hdf5Handle optimizer = group_handle(H5Gopen2(file.get(), "/optimizer", H5P_DEFAULT));
    const auto optimizer_step = optimizer.valid() ? read_int64_attribute(optimizer.get(), "step") : std::nullopt;
    if (!optimizer_step || *optimizer_step < 0 || *optimizer_step > *step)
      throw UsageError(where + " has no valid step attribute on /optimizer");
    state.optimizer_step = *optimizer_step;
    // A run that scales its loss continues with the stored scale (none stored: its own start).
    if (const auto scale = read_double_attribute(optimizer.get(), "loss_scale"); scale && state.loss_scale > 0) {
      const auto finite_steps = read_int64_attribute(optimizer.get(), "loss_scale_finite_steps");
      if (!(*scale >= 1) || !finite_steps || *finite_steps < 0)
        throw UsageError(where + " has an invalid loss_scale or loss_scale_finite_steps attribute on /optimizer");
      state.loss_scale = *scale;
      state.loss_scale_finite_steps = *finite_steps;
    }
    const std::int64_t layers = count_links(file.get(), "/model/layers");
    if (layers != scope.layer_count)
      throw UsageError(where + " holds " + std::to_string(std::max<std::int64_t>(layers, 0)) +
                       " layers but the model has " + std::to_string(scope.layer_count) +
                       " (--layers)" + differing(file.get()));
    for (const ParameterTensor& global : scope.global_tensors) {
      for (int part = 0; part < part_count; ++part) {
        const std::string name = dataset_name(global, part);
        const auto shape = dataset_shape(file.get(), name);
        if (shape.empty()) throw UsageError(where + " has no dataset " + name);
        if (shape != global.global_shape)
          throw UsageError(where + ": " + name + " has shape " + shape_text(shape) +
                           " but the model needs " + shape_text(global.global_shape) + differing(file.get()));
        Hdf5Handle dataset = dataset_handle(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
        const auto checksum = read_int64_attribute(dataset.get(), "crc32");
        if (!checksum) throw UsageError(where + ": " + name + " has no crc32 attribute");
        stored_checksums.push_back(static_cast<std::uint32_t>(*checksum));
      }
    }
  });
  agree_or_throw(scope.world, [&] {
    Hdf5Handle transfer = independent_transfer();
    bool read = true;
    const StatePlacement& placement = state.placement;
    for (const ParameterTensor& global : scope.global_tensors) {
      for (int part = 0; part < part_count; ++part) {
        // Masters and moments go wherever this rank updates them; the values (the masters
        // rounded, with a 16-bit param type) wherever it holds them.
        Hdf5Handle dataset = dataset_handle(H5Dopen2(file.get(), dataset_name(global, part).c_str(), H5P_DEFAULT));
        const bool held_apart = part == 0 && placement.precision.keeps_master();
        if (part > 0 || held_apart)
          read = read_runs(dataset.get(), transfer.get(), ranges_of(placement.updated, global.global_index),
                           run_parts[part], DataType::float32, scope.allocator) && read;
        if (part == 0)
          read = read_runs(dataset.get(), transfer.get(), ranges_of(placement.held, global.global_index),
                           RunField::values, placement.precision.param, scope.allocator) && read;
      }
    }
    if (!read) throw RuntimeFailure(where + ": reading the tensors failed (corrupted?)");
  });
  file.close();
  const std::vector<WrittenSlice> slices = written_slices(state.placement, scope.global_tensors);
  const std::vector<std::uint32_t> checksums = dataset_checksums(
      slices, slice_checksums(slices, {}, scope.allocator), scope.global_tensors, scope.world);
  agree_or_throw(scope.world, [&] {
    for (std::size_t dataset = 0; dataset < checksums.size(); ++dataset)
      if (checksums[dataset] != stored_checksums[dataset])
        throw UsageError(where + ": checksum mismatch in " +
                         dataset_name(scope.global_tensors[dataset / part_count],
                                      static_cast<int>(dataset % part_count)) +
                         " (the file is corrupted)");
  });
  return file_path.string();
}

}  // namespace mlptrain
