// Reading one array of an `hdf5` dataset file (see hdf5_array.hpp).
#include "data/hdf5_array.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"

namespace mlptrain {

namespace {

// An attribute of `dataset` read as one double, or `fallback` where it is absent.
double number_attribute(hid_t dataset, const char* name, double fallback, const std::string& where) {
  if (H5Aexists(dataset, name) <= 0) return fallback;
  Hdf5Handle attribute = attribute_handle(H5Aopen(dataset, name, H5P_DEFAULT));
  Hdf5Handle space = dataspace_handle(H5Aget_space(attribute.get()));
  double value = 0;
  if (!attribute.valid() || H5Sget_simple_extent_npoints(space.get()) != 1 ||
      H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value) < 0 || !std::isfinite(value))
    throw UsageError("--data-path: the attribute '" + std::string(name) + "' of " + where +
                     " must be one finite number");
  return value;
}

// Calls `run(begin, end)` for each run [begin, end) of consecutive rows in `rows` (ascending).
template <typename Run>
void for_each_run(const std::vector<std::int64_t>& rows, Run&& run) {
  for (std::size_t begin = 0; begin < rows.size();) {
    std::size_t end = begin + 1;
    while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
    run(begin, end);
    begin = end;
  }
}

// The position of the first non-finite of `count` values (`count` when there is none).
std::size_t first_non_finite(const float* values, std::size_t count) {
  return static_cast<std::size_t>(std::find_if(values, values + count, [](float v) { return !std::isfinite(v); }) -
                                  values);
}

}  // namespace

Hdf5Array::Hdf5Array(hid_t file, std::string name, std::string path)
    : name_(std::move(name)), path_(std::move(path)) {
  if (H5Lexists(file, name_.c_str(), H5P_DEFAULT) <= 0)
    throw UsageError("--data-path: '" + path_ + "' has no dataset " + name_);
  dataset_ = dataset_handle(H5Dopen2(file, name_.c_str(), H5P_DEFAULT));
  if (!dataset_.valid()) throw UsageError("--data-path: " + where() + " is not a dataset");
  Hdf5Handle type = type_handle(H5Dget_type(dataset_.get()));
  type_class_ = H5Tget_class(type.get());
  type_bytes_ = H5Tget_size(type.get());
  type_signed_ = type_class_ == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_2;
  Hdf5Handle space = dataspace_handle(H5Dget_space(dataset_.get()));
  dimensions_ = H5Sget_simple_extent_ndims(space.get());
  if ((type_class_ != H5T_INTEGER && type_class_ != H5T_FLOAT) || dimensions_ < 1 || dimensions_ > 2)
    throw UsageError("--data-path: " + where() + " must be a numeric array of 1 or 2 dimensions");
  hsize_t shape[2] = {0, 1};
  H5Sget_simple_extent_dims(space.get(), shape, nullptr);
  rows_ = static_cast<std::int64_t>(shape[0]);
  columns_ = static_cast<std::int64_t>(dimensions_ == 2 ? shape[1] : 1);
  scale_ = number_attribute(dataset_.get(), "scale", 1.0, where());
  offset_ = number_attribute(dataset_.get(), "offset", 0.0, where());
  find_direct_layout(type.get());
}

Hdf5Array::Descriptor::~Descriptor() {
  if (value_ >= 0) ::close(value_);
}

void Hdf5Array::find_direct_layout(hid_t type) {
  Hdf5Handle creation = property_handle(H5Dget_create_plist(dataset_.get()));
  const haddr_t address = H5Dget_offset(dataset_.get());  // undefined unless contiguous and written
  if (!creation.valid() || H5Pget_layout(creation.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(creation.get()) != 0 ||
      H5Pget_external_count(creation.get()) != 0 || address == HADDR_UNDEF)
    return;
  const std::pair<hid_t, Direct> types[] = {{H5T_STD_U8LE, Direct::uint8},   {H5T_STD_U16LE, Direct::uint16},
                                            {H5T_STD_I32LE, Direct::int32},  {H5T_STD_I64LE, Direct::int64},
                                            {H5T_IEEE_F32LE, Direct::float32}, {H5T_IEEE_F64LE, Direct::float64}};
  for (const auto& [stored, direct] : types) {
    if (H5Tequal(type, stored) <= 0) continue;
    Descriptor descriptor(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    // A file that cannot be opened again, or is shorter than the array, is left to the library.
    struct stat status {};
    const auto bytes = static_cast<std::uint64_t>(rows_ * columns_) * type_bytes_;
    if (descriptor.get() < 0 || ::fstat(descriptor.get(), &status) != 0 ||
        static_cast<std::uint64_t>(status.st_size) < address + bytes)
      return;
    descriptor_ = std::move(descriptor);
    direct_ = direct;
    direct_offset_ = static_cast<std::size_t>(address);
    direct_bytes_ = type_bytes_;
    return;
  }
}

std::string Hdf5Array::where() const { return name_ + " in '" + path_ + "'"; }

std::size_t Hdf5Array::memory_bytes() const {
  return static_cast<std::size_t>(rows_ * columns_) * (compact() ? type_bytes_ : 4);
}

hid_t Hdf5Array::memory_type(Kept kept) const {
  switch (kept) {
    case Kept::uint8: return H5T_NATIVE_UINT8;
    case Kept::uint16: return H5T_NATIVE_UINT16;
    case Kept::float32: return H5T_NATIVE_FLOAT;
    case Kept::int32: return H5T_NATIVE_INT32;
  }
  return H5T_NATIVE_FLOAT;
}

void Hdf5Array::load(bool labels) {
  kept_ = labels ? Kept::int32 : !compact() ? Kept::float32 : type_bytes_ == 1 ? Kept::uint8 : Kept::uint16;
  memory_.resize(memory_bytes());
  if (H5Dread(dataset_.get(), memory_type(kept_), H5S_ALL, H5S_ALL, H5P_DEFAULT, memory_.data()) < 0)
    throw UsageError("--data-path: cannot read " + where());
  const auto values = static_cast<std::size_t>(rows_ * columns_);
  if (kept_ == Kept::int32) {
    const auto* label = reinterpret_cast<const std::int32_t*>(memory_.data());
    const auto* negative = std::find_if(label, label + values, [](std::int32_t value) { return value < 0; });
    if (negative != label + values)
      throw UsageError("--data-path: " + where() + " row " + std::to_string((negative - label) / columns_) +
                       " holds a negative label (" + std::to_string(*negative) + ")");
  } else if (kept_ == Kept::float32) {
    const auto* value = reinterpret_cast<const float*>(memory_.data());
    if (const std::size_t bad = first_non_finite(value, values); bad < values)
      throw UsageError(non_finite(static_cast<std::int64_t>(bad) / columns_, value[bad]));
  }
  loaded_ = true;
}

void Hdf5Array::scale_rows(float* out, std::size_t values) const {
  if (scale_ == 1.0 && offset_ == 0.0) return;
  const auto scale = static_cast<float>(scale_), offset = static_cast<float>(offset_);
  for (std::size_t k = 0; k < values; ++k) out[k] = out[k] * scale + offset;
}

std::string Hdf5Array::non_finite(std::int64_t row, float value) const {
  return "--data-path: " + where() + " row " + std::to_string(row) + " holds a non-finite value (" +
         std::to_string(value) + ")";
}

void Hdf5Array::check_finite(const float* values, std::span<const std::int64_t> rows) const {
  const auto columns = static_cast<std::size_t>(columns_);
  if (const std::size_t bad = first_non_finite(values, rows.size() * columns); bad < rows.size() * columns)
    throw RuntimeFailure(non_finite(rows[bad / columns], values[bad]));
}

template <typename Out>
void Hdf5Array::read_rows_from_memory(std::span<const std::int64_t> indices, Out* out) const {
  const auto columns = static_cast<std::size_t>(columns_);
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto first = static_cast<std::size_t>(indices[i]) * columns;
    Out* row = out + i * columns;
    auto convert = [&](const auto* stored) { std::copy_n(stored + first, columns, row); };
    switch (kept_) {
      case Kept::uint8: convert(reinterpret_cast<const std::uint8_t*>(memory_.data())); break;
      case Kept::uint16: convert(reinterpret_cast<const std::uint16_t*>(memory_.data())); break;
      case Kept::float32: convert(reinterpret_cast<const float*>(memory_.data())); break;
      case Kept::int32: convert(reinterpret_cast<const std::int32_t*>(memory_.data())); break;
    }
  }
  if constexpr (std::is_same_v<Out, float>) scale_rows(out, indices.size() * columns);
}

namespace {

// `count` little-endian values of `Stored` at `bytes` as `Out` (this machine is little-endian,
// as x86-64 and AArch64 Linux are).
template <typename Stored, typename Out>
void convert(const std::byte* bytes, std::size_t count, Out* out) {
  for (std::size_t k = 0; k < count; ++k) {
    Stored value;
    std::memcpy(&value, bytes + k * sizeof(Stored), sizeof(Stored));
    out[k] = static_cast<Out>(value);
  }
}

}  // namespace

template <typename Out>
void Hdf5Array::read_directly(const std::vector<std::int64_t>& rows, std::vector<Out>& read) const {
  const auto columns = static_cast<std::size_t>(columns_);
  const std::size_t row_bytes = columns * direct_bytes_;
  std::vector<std::byte> bytes;
  for_each_run(rows, [&](std::size_t begin, std::size_t end) {
    bytes.resize((end - begin) * row_bytes);
    // pread may return fewer bytes than asked: go on from where it stopped.
    for (std::size_t done = 0; done < bytes.size();) {
      const ssize_t got = ::pread(descriptor_.get(), bytes.data() + done, bytes.size() - done,
                                  static_cast<off_t>(direct_offset_ + static_cast<std::size_t>(rows[begin]) * row_bytes + done));
      if (got <= 0) throw RuntimeFailure("--data-path: cannot read " + where() + " (the file is shorter than HDF5 says)");
      done += static_cast<std::size_t>(got);
    }
    Out* into = read.data() + begin * columns;
    const std::size_t count = (end - begin) * columns;
    switch (direct_) {
      case Direct::uint8: convert<std::uint8_t>(bytes.data(), count, into); break;
      case Direct::uint16: convert<std::uint16_t>(bytes.data(), count, into); break;
      case Direct::int32: convert<std::int32_t>(bytes.data(), count, into); break;
      case Direct::int64: convert<std::int64_t>(bytes.data(), count, into); break;
      case Direct::float32: convert<float>(bytes.data(), count, into); break;
      case Direct::float64: convert<double>(bytes.data(), count, into); break;
      case Direct::none: break;
    }
  });
}

template <typename Out>
void Hdf5Array::read_distinct_rows(const std::vector<std::int64_t>& rows, std::vector<Out>& read) const {
  if (direct_ != Direct::none) {
    read_directly(rows, read);
    return;
  }
  // One union of the runs of neighbouring rows, read at once by the library.
  Hdf5Handle file_space = dataspace_handle(H5Dget_space(dataset_.get()));
  H5Sselect_none(file_space.get());
  for_each_run(rows, [&](std::size_t begin, std::size_t end) {
    const hsize_t start[2] = {static_cast<hsize_t>(rows[begin]), 0};
    const hsize_t count[2] = {static_cast<hsize_t>(end - begin), static_cast<hsize_t>(columns_)};
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_OR, start, nullptr, count, nullptr);
  });
  const hsize_t shape[2] = {static_cast<hsize_t>(rows.size()), static_cast<hsize_t>(columns_)};
  Hdf5Handle memory_space = dataspace_handle(H5Screate_simple(dimensions_, shape, nullptr));
  const hid_t type = std::is_same_v<Out, float> ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
  if (H5Dread(dataset_.get(), type, memory_space.get(), file_space.get(), H5P_DEFAULT, read.data()) < 0)
    throw RuntimeFailure("--data-path: cannot read " + where());
}

template <typename Out>
void Hdf5Array::read_rows_from_file(std::span<const std::int64_t> indices, Out* out) const {
  // Every distinct row once, in ascending order, then each placed where it was asked for.
  std::vector<std::int64_t> rows(indices.begin(), indices.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const auto columns = static_cast<std::size_t>(columns_);
  std::vector<Out> read(rows.size() * columns);
  read_distinct_rows(rows, read);
  if constexpr (std::is_same_v<Out, float>) {
    check_finite(read.data(), rows);
    scale_rows(read.data(), read.size());
  }
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto position = static_cast<std::size_t>(std::lower_bound(rows.begin(), rows.end(), indices[i]) - rows.begin());
    std::copy_n(read.data() + position * columns, columns, out + i * columns);
  }
}

void Hdf5Array::read_rows(std::span<const std::int64_t> indices, float* out) const {
  if (indices.empty()) return;
  loaded_ ? read_rows_from_memory(indices, out) : read_rows_from_file(indices, out);
}

void Hdf5Array::read_rows(std::span<const std::int64_t> indices, std::int32_t* out) const {
  if (indices.empty()) return;
  loaded_ ? read_rows_from_memory(indices, out) : read_rows_from_file(indices, out);
}

}  // namespace mlptrain
