// Data room: the sample-to-rank mapping, built-in generators and the HDF5 reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "data/dataset.hpp"
#include "data/sample_order.hpp"

using namespace mlptrain;

TEST(BatchLayout, MicroBatchesThenDataRanksAreContiguousSlices) {
  const BatchLayout layout{.global_batch = 16, .micro_batches = 2, .data_parallel = 4};
  EXPECT_EQ(layout.micro_batch_size(), 8);
  EXPECT_EQ(layout.local_size(), 2);
  EXPECT_EQ(layout.first_position(0, 0, 0), 0);
  EXPECT_EQ(layout.first_position(0, 0, 3), 6);
  EXPECT_EQ(layout.first_position(0, 1, 0), 8);
  EXPECT_EQ(layout.first_position(2, 1, 2), 2 * 16 + 8 + 4);
}

TEST(BatchLayout, AResumedRunContinuesFromTheStoredPosition) {
  // Written with B = 16 for 10 steps (position 160), resumed with B = 8.
  const BatchLayout layout{.global_batch = 8, .micro_batches = 1, .data_parallel = 2,
                           .resumed_step = 10, .resumed_position = 160};
  EXPECT_EQ(layout.step_position(10), 160);
  EXPECT_EQ(layout.first_position(11, 0, 1), 160 + 8 + 4);
}

TEST(SampleOrder, WrapsModuloTheDatasetSize) {
  SampleOrder order(10, false, 1);
  EXPECT_EQ(order.samples(8, 4), (std::vector<std::int64_t>{8, 9, 0, 1}));
}

TEST(SampleOrder, ShuffleIsASeededPermutationPerEpoch) {
  SampleOrder order(50, true, 7), same(50, true, 7), other(50, true, 8);
  const auto epoch0 = order.samples(0, 50), epoch1 = order.samples(50, 50);
  EXPECT_EQ(std::set<std::int64_t>(epoch0.begin(), epoch0.end()).size(), 50u);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(same.samples(0, 50), epoch0);
  EXPECT_NE(other.samples(0, 50), epoch0);
  EXPECT_EQ(same.sample_at(73), epoch1[23]);  // random access agrees
}

TEST(SyntheticData, SlicesAreGeneratedAloneAndSplitsDiffer) {
  for (DatasetKind kind : {DatasetKind::teacher, DatasetKind::mixture}) {
    auto dataset = open_dataset({.kind = kind, .input_dim = 6, .output_dim = 3});
    const DatasetInfo& info = dataset->info();
    EXPECT_EQ(info.input_dim, 6);
    EXPECT_EQ(info.output_dim, 3);
    EXPECT_GT(info.test_size, 0);
    const std::vector<std::int64_t> all = {0, 1, 2, 3, 4}, some = {3, 1};
    std::vector<float> x_all(30), x_some(12), y_all(15), y_some(6), x_test(30);
    std::vector<std::int32_t> labels_all(5), labels_some(2);
    const bool regression = info.kind == TargetKind::regression;
    dataset->read(Split::train, all, x_all.data(), regression ? y_all.data() : nullptr,
                  regression ? nullptr : labels_all.data());
    dataset->read(Split::train, some, x_some.data(), regression ? y_some.data() : nullptr,
                  regression ? nullptr : labels_some.data());
    for (int d = 0; d < 6; ++d) {
      EXPECT_EQ(x_some[d], x_all[3 * 6 + d]);
      EXPECT_EQ(x_some[6 + d], x_all[1 * 6 + d]);
    }
    if (regression) {
      for (int o = 0; o < 3; ++o) EXPECT_EQ(y_some[o], y_all[3 * 3 + o]);
    } else {
      EXPECT_EQ(labels_some[0], labels_all[3]);
      for (std::int32_t label : labels_all) EXPECT_LT(label, 3);
    }
    dataset->read(Split::test, all, x_test.data(), nullptr, nullptr);
    EXPECT_NE(x_test, x_all);
  }
}

namespace {

// Writes a small HDF5 data file: /x [rows, 3] = row index + column / 10, and /y.
std::string write_data_file(const std::string& name, bool labels, int rows = 20,
                            bool with_test = true) {
  const std::string path = ::testing::TempDir() + name;
  Hdf5Handle file = file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  const auto write = [&](const char* dataset, hid_t type, std::vector<hsize_t> dims, const void* data,
                         hid_t memory_type) {
    Hdf5Handle space = dataspace_handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    Hdf5Handle set = dataset_handle(H5Dcreate2(file.get(), dataset, type, space.get(), H5P_DEFAULT,
                                               H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  };
  for (const char* suffix : {"", "_test"}) {
    if (*suffix && !with_test) continue;
    std::vector<double> x(rows * 3);  // stored as float64: the reader converts
    std::vector<float> y(rows * 2);
    std::vector<std::int64_t> label(rows);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < 3; ++c) x[r * 3 + c] = r + c / 10.0 + (*suffix ? 1000 : 0);
      y[r * 2] = static_cast<float>(r);
      y[r * 2 + 1] = static_cast<float>(-r);
      label[r] = r % 4;
    }
    write((std::string("/x") + suffix).c_str(), H5T_IEEE_F64LE, {hsize_t(rows), 3}, x.data(), H5T_NATIVE_DOUBLE);
    if (labels)
      write((std::string("/y") + suffix).c_str(), H5T_STD_I64LE, {hsize_t(rows)}, label.data(), H5T_NATIVE_INT64);
    else
      write((std::string("/y") + suffix).c_str(), H5T_IEEE_F32LE, {hsize_t(rows), 2}, y.data(), H5T_NATIVE_FLOAT);
  }
  return path;
}

std::string open_error(const DataOptions& options) {
  try {
    open_dataset(options);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Hdf5Dataset, ReadsRowsInAnyOrderBothSplits) {
  silence_hdf5_errors();
  const std::string path = write_data_file("regression.h5", false);
  auto dataset = open_dataset({.kind = DatasetKind::hdf5, .path = path});
  const DatasetInfo& info = dataset->info();
  EXPECT_EQ(info.train_size, 20);
  EXPECT_EQ(info.test_size, 20);
  EXPECT_EQ(info.input_dim, 3);
  EXPECT_EQ(info.output_dim, 2);
  EXPECT_EQ(info.kind, TargetKind::regression);
  const std::vector<std::int64_t> indices = {7, 3, 4, 19, 5};
  std::vector<float> x(15), y(10);
  dataset->read(Split::train, indices, x.data(), y.data(), nullptr);
  for (std::size_t i = 0; i < indices.size(); ++i) {
    EXPECT_FLOAT_EQ(x[i * 3 + 1], indices[i] + 0.1f);
    EXPECT_EQ(y[i * 2 + 1], -static_cast<float>(indices[i]));
  }
  dataset->read(Split::test, indices, x.data(), nullptr, nullptr);
  EXPECT_FLOAT_EQ(x[0], 1007.0f);
}

TEST(Hdf5Dataset, IntegerTargetsAreLabels) {
  const std::string path = write_data_file("labels.h5", true);
  auto dataset = open_dataset({.kind = DatasetKind::hdf5, .path = path, .output_dim = 6});
  EXPECT_EQ(dataset->info().kind, TargetKind::classification);
  EXPECT_EQ(dataset->info().output_dim, 6);  // more classes than labels seen is allowed
  std::vector<std::int32_t> labels(3);
  const std::vector<std::int64_t> indices = {5, 6, 7};
  dataset->read(Split::train, indices, nullptr, nullptr, labels.data());
  EXPECT_EQ(labels, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(open_dataset({.kind = DatasetKind::hdf5, .path = path})->info().output_dim, 4);
}

TEST(Hdf5Dataset, BadFilesAndContradictionsAreNamed) {
  silence_hdf5_errors();
  EXPECT_NE(open_error({.kind = DatasetKind::hdf5, .path = "/no/such.h5"}).find("/no/such.h5"), std::string::npos);
  const std::string text = ::testing::TempDir() + "not_hdf5.h5";
  std::ofstream(text) << "hello";
  EXPECT_NE(open_error({.kind = DatasetKind::hdf5, .path = text}).find("not an HDF5 file"), std::string::npos);
  const std::string path = write_data_file("contradiction.h5", false);
  const std::string input = open_error({.kind = DatasetKind::hdf5, .path = path, .input_dim = 4});
  EXPECT_NE(input.find("--input-dim 4"), std::string::npos);
  EXPECT_NE(input.find("3 columns"), std::string::npos);
  EXPECT_NE(open_error({.kind = DatasetKind::hdf5, .path = path, .output_dim = 5}).find("--output-dim 5"),
            std::string::npos);
  const std::string labels = write_data_file("few_classes.h5", true);
  EXPECT_NE(open_error({.kind = DatasetKind::hdf5, .path = labels, .output_dim = 2}).find("4 classes"),
            std::string::npos);
  // A file without /y.
  const std::string missing = ::testing::TempDir() + "missing_y.h5";
  {
    Hdf5Handle file = file_handle(H5Fcreate(missing.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    const hsize_t dims[2] = {4, 2};
    Hdf5Handle space = dataspace_handle(H5Screate_simple(2, dims, nullptr));
    Hdf5Handle x = dataset_handle(H5Dcreate2(file.get(), "/x", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  }
  EXPECT_NE(open_error({.kind = DatasetKind::hdf5, .path = missing}).find("no dataset /y"), std::string::npos);
}
