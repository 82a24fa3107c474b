// Tensor runs to and from HDF5 datasets (see tensor_io.hpp).
#include "io/tensor_io.hpp"

#include <algorithm>

#include "core/half_float.hpp"
#include "core/hdf5_handle.hpp"

namespace mlptrain {

std::vector<Hyperslab> hyperslabs_of_range(const std::vector<std::int64_t>& shape,
                                           std::int64_t offset, std::int64_t count) {
  std::vector<Hyperslab> slabs;
  if (count <= 0) return slabs;
  if (shape.size() == 1) {
    slabs.push_back({{static_cast<hsize_t>(offset)}, {static_cast<hsize_t>(count)}});
    return slabs;
  }
  // Split along the first dimension: a partial first slice, whole slices, a partial last slice;
  // the partial ones recurse into the remaining dimensions.
  const std::vector<std::int64_t> inner_shape(shape.begin() + 1, shape.end());
  std::int64_t inner = 1;
  for (std::int64_t extent : inner_shape) inner *= extent;
  const auto prefixed = [&](std::int64_t outer, std::int64_t begin, std::int64_t end) {
    for (Hyperslab slab : hyperslabs_of_range(inner_shape, begin, end - begin)) {
      slab.start.insert(slab.start.begin(), static_cast<hsize_t>(outer));
      slab.count.insert(slab.count.begin(), 1);
      slabs.push_back(std::move(slab));
    }
  };
  std::int64_t at = offset;
  const std::int64_t end = offset + count;
  if (at % inner != 0) {
    const std::int64_t outer = at / inner;
    const std::int64_t slice_end = std::min(end, (outer + 1) * inner);
    prefixed(outer, at - outer * inner, slice_end - outer * inner);
    at = slice_end;
  }
  if (end - at >= inner) {
    const std::int64_t whole = (end - at) / inner;
    Hyperslab slab{{static_cast<hsize_t>(at / inner)}, {static_cast<hsize_t>(whole)}};
    for (std::int64_t extent : inner_shape) {
      slab.start.push_back(0);
      slab.count.push_back(static_cast<hsize_t>(extent));
    }
    slabs.push_back(std::move(slab));
    at += whole * inner;
  }
  if (at < end) prefixed(at / inner, 0, end - at / inner * inner);
  return slabs;
}

namespace {

// Selects the union of the runs' hyperslabs in the file space; returns the memory space of the
// same number of elements (or an empty selection on both when there are no runs).
Hdf5Handle select_runs(hid_t file_space, const std::vector<const StateRange*>& runs,
                       hsize_t& total) {
  total = 0;
  H5Sselect_none(file_space);
  const int rank = H5Sget_simple_extent_ndims(file_space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(file_space, dims.data(), nullptr);
  const std::vector<std::int64_t> shape(dims.begin(), dims.end());
  for (const StateRange* run : runs) {
    for (const Hyperslab& slab : hyperslabs_of_range(shape, run->offset, run->count))
      H5Sselect_hyperslab(file_space, H5S_SELECT_OR, slab.start.data(), nullptr, slab.count.data(),
                          nullptr);
    total += static_cast<hsize_t>(run->count);
  }
  const hsize_t extent = std::max<hsize_t>(total, 1);
  Hdf5Handle memory = dataspace_handle(H5Screate_simple(1, &extent, nullptr));
  if (total == 0) H5Sselect_none(memory.get());
  return memory;
}

// The runs' memory when it is one contiguous piece of host memory of fp32 (no staging needed),
// else null.
float* contiguous(const std::vector<const StateRange*>& runs, RunField field, DataType type, const Allocator& allocator) {
  if (runs.empty() || allocator.device() != Device::cpu || type != DataType::float32) return nullptr;
  for (std::size_t index = 1; index < runs.size(); ++index)
    if (field_of(*runs[index], field) != advance(field_of(*runs[index - 1], field), runs[index - 1]->count, type))
      return nullptr;
  return static_cast<float*>(field_of(*runs.front(), field));
}

// Host memory for `count` floats: a workspace buffer of a host allocator, else plain host memory
// (a device's ledger counts device memory only).
struct HostStagingBuffer {
  Buffer charged;
  std::vector<float> plain;
  float* get(Allocator& allocator, std::size_t count) {
    if (allocator.device() == Device::cpu) {
      charged = allocator.allocate_floats(MemoryState::workspace, count);
      return charged.floats();
    }
    plain.resize(count);
    return plain.data();
  }
};

}  // namespace

void* field_of(const StateRange& run, RunField field) {
  switch (field) {
    case RunField::values: return run.values;
    case RunField::master: return run.master;
    case RunField::exp_avg: return run.exp_avg;
    case RunField::exp_avg_sq: return run.exp_avg_sq;
  }
  return nullptr;
}

bool read_runs(hid_t dataset, hid_t transfer, const std::vector<const StateRange*>& runs, RunField field,
               DataType type, Allocator& allocator) {
  Hdf5Handle file_space = dataspace_handle(H5Dget_space(dataset));
  hsize_t total = 0;
  Hdf5Handle memory_space = select_runs(file_space.get(), runs, total);
  float* data = contiguous(runs, field, type, allocator);
  const bool staged = data == nullptr && total > 0;
  HostStagingBuffer staging;
  if (staged) data = staging.get(allocator, total);
  const bool read = H5Dread(dataset, H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                            transfer, data) >= 0;
  if (!staged) return read;
  std::vector<std::byte> rounded;  // a run in a 16-bit type, on the host
  const float* at = data;
  for (const StateRange* run : runs) {
    const auto count = static_cast<std::size_t>(run->count);
    const void* source = at;
    if (type != DataType::float32) {
      rounded.resize(count * size_of(type));
      for (std::size_t i = 0; i < count; ++i) store_element(rounded.data(), i, type, at[i]);
      source = rounded.data();
    }
    allocator.copy_host_to_any(field_of(*run, field), source, count * size_of(type));
    at += count;
  }
  return read;
}

}  // namespace mlptrain
