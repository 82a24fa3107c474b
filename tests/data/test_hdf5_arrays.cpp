// The HDF5 reader's stored types, scaling and bad rows: images of uint8, uint16, fp16, bf16 and
// fp32 fed as value * scale + offset, the same rows whether the file is held in memory or read a
// batch at a time (straight from the file where the array is contiguous in a plain type, through
// the library where it is compressed or of a 16-bit float type), and non-finite inputs or
// negative labels named by array, file and row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "data/dataset.hpp"

using namespace mlptrain;

namespace {

constexpr int rows = 24, columns = 5;

// A 16-bit float type of the file: sign, `exponent_bits`, the rest mantissa (fp16: 5, bf16: 8).
Hdf5Handle half_type(int exponent_bits) {
  Hdf5Handle type = type_handle(H5Tcopy(H5T_IEEE_F32LE));
  const int mantissa_bits = 15 - exponent_bits;
  H5Tset_fields(type.get(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits);
  H5Tset_offset(type.get(), 0);
  H5Tset_precision(type.get(), 16);
  H5Tset_size(type.get(), 2);
  H5Tset_ebias(type.get(), (1u << (exponent_bits - 1)) - 1);
  return type;
}

// The value row r, column c holds in the file: small integers, exact in every stored type.
double stored(int r, int c) { return (r * columns + c) % 200; }

// Written contiguously, or in compressed chunks of 7 rows.
void write_array(hid_t file, const char* name, hid_t file_type, std::vector<hsize_t> shape, const void* data,
                 hid_t memory_type, bool compressed = false) {
  Hdf5Handle space = dataspace_handle(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  Hdf5Handle creation = property_handle(H5Pcreate(H5P_DATASET_CREATE));
  if (compressed) {
    std::vector<hsize_t> chunk = shape;
    chunk[0] = 7;
    H5Pset_chunk(creation.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(creation.get(), 4);
  }
  Hdf5Handle set = dataset_handle(
      H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, creation.get(), H5P_DEFAULT));
  H5Dwrite(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
}

void write_attribute(hid_t file, const char* array, const char* name, double value) {
  Hdf5Handle set = dataset_handle(H5Dopen2(file, array, H5P_DEFAULT));
  Hdf5Handle space = dataspace_handle(H5Screate(H5S_SCALAR));
  Hdf5Handle attribute = attribute_handle(
      H5Acreate2(set.get(), name, H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5Awrite(attribute.get(), H5T_NATIVE_DOUBLE, &value);
}

// /x [rows, columns] of `x_type` holding stored(r, c) (with `x` instead where given), scale 0.5
// and offset -1; /y int64 labels r % 3 (with `labels` instead where given).
std::string write_file(const std::string& name, hid_t x_type, std::vector<double> x = {},
                       std::vector<std::int64_t> labels = {}, bool compressed = false) {
  const std::string path = ::testing::TempDir() + name;
  Hdf5Handle file = file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (x.empty())
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < columns; ++c) x.push_back(stored(r, c));
  if (labels.empty())
    for (int r = 0; r < rows; ++r) labels.push_back(r % 3);
  write_array(file.get(), "/x", x_type, {rows, columns}, x.data(), H5T_NATIVE_DOUBLE, compressed);
  write_attribute(file.get(), "/x", "scale", 0.5);
  write_attribute(file.get(), "/x", "offset", -1.0);
  write_array(file.get(), "/y", H5T_STD_I64LE, {rows}, labels.data(), H5T_NATIVE_INT64);
  return path;
}

std::unique_ptr<Dataset> open(const std::string& path, bool in_memory) {
  return open_dataset({.kind = DatasetKind::hdf5, .path = path, .memory_cap_bytes = in_memory ? 1 << 20 : 0});
}

template <typename Failure>
std::string failure(auto&& call) {
  try {
    call();
  } catch (const Failure& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Hdf5Arrays, EveryStoredTypeIsFedScaledTheSameFromMemoryOrFile) {
  silence_hdf5_errors();
  const Hdf5Handle fp16 = half_type(5), bf16 = half_type(8);
  struct Stored {
    std::string name;
    hid_t type;
    bool compressed;
    bool read_directly;  // from the file without the library
  };
  const std::vector<Stored> types = {
      {"uint8", H5T_STD_U8LE, false, true},       {"uint16", H5T_STD_U16LE, false, true},
      {"fp16", fp16.get(), false, false},         {"bf16", bf16.get(), false, false},
      {"fp32", H5T_IEEE_F32LE, false, true},      {"fp64", H5T_IEEE_F64LE, false, true},
      {"uint8 compressed", H5T_STD_U8LE, true, false}};
  // Unsorted, with a repeat and a run of neighbours: the order asked is the order fed.
  const std::vector<std::int64_t> indices = {17, 3, 4, 5, 23, 3, 0};
  for (const auto& [name, type, compressed, read_directly] : types) {
    const std::string path = write_file("types_" + name + ".h5", type, {}, {}, compressed);
    for (bool in_memory : {false, true}) {
      SCOPED_TRACE(name + (in_memory ? " in memory" : " from the file"));
      auto dataset = open(path, in_memory);
      EXPECT_EQ(dataset->reads_from_file(), !in_memory);
      EXPECT_EQ(dataset->readable_from_any_thread(), in_memory || read_directly);
      std::vector<float> x(indices.size() * columns, std::numeric_limits<float>::quiet_NaN());
      std::vector<std::int32_t> labels(indices.size(), -1);
      dataset->read(Split::train, indices, x.data(), nullptr, labels.data());
      for (std::size_t i = 0; i < indices.size(); ++i) {
        EXPECT_EQ(labels[i], indices[i] % 3);
        for (int c = 0; c < columns; ++c)
          EXPECT_EQ(x[i * columns + c], static_cast<float>(stored(static_cast<int>(indices[i]), c) * 0.5 - 1.0))
              << "row " << indices[i] << " column " << c;
      }
    }
  }
}

TEST(Hdf5Arrays, AFileLargerThanTheCapIsReadFromTheFile) {
  const std::string path = write_file("cap.h5", H5T_STD_U8LE);
  // 24 x 5 bytes of images and 24 int32 labels: 216 bytes.
  EXPECT_FALSE(open_dataset({.kind = DatasetKind::hdf5, .path = path, .memory_cap_bytes = 216})->reads_from_file());
  EXPECT_TRUE(open_dataset({.kind = DatasetKind::hdf5, .path = path, .memory_cap_bytes = 215})->reads_from_file());
}

TEST(Hdf5Arrays, ANonFiniteInputIsNamedByArrayFileAndRow) {
  silence_hdf5_errors();
  std::vector<double> x(rows * columns, 1.0);
  x[13 * columns + 2] = std::nan("");
  const std::string path = write_file("nan.h5", H5T_IEEE_F32LE, x);
  // Held in memory: found when the file opens.
  const std::string at_open = failure<UsageError>([&] { open(path, true); });
  for (const char* part : {"/x", "nan.h5", "row 13", "non-finite"})
    EXPECT_NE(at_open.find(part), std::string::npos) << at_open;
  // Read a batch at a time: found by the read that meets it, and only by that one.
  auto dataset = open(path, false);
  std::vector<float> batch(3 * columns);
  const std::vector<std::int64_t> clean = {1, 2, 3}, dirty = {12, 13, 14};
  EXPECT_NO_THROW(dataset->read(Split::train, clean, batch.data(), nullptr, nullptr));
  const std::string at_read =
      failure<RuntimeFailure>([&] { dataset->read(Split::train, dirty, batch.data(), nullptr, nullptr); });
  for (const char* part : {"/x", "nan.h5", "row 13"}) EXPECT_NE(at_read.find(part), std::string::npos) << at_read;
}

TEST(Hdf5Arrays, ANegativeLabelIsNamedByRow) {
  silence_hdf5_errors();
  std::vector<std::int64_t> labels(rows, 1);
  labels[9] = -2;
  const std::string path = write_file("negative.h5", H5T_STD_U8LE, {}, labels);
  for (bool in_memory : {false, true}) {
    const std::string message = failure<UsageError>([&] { open(path, in_memory); });
    for (const char* part : {"/y", "negative.h5", "row 9", "-2"})
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}
