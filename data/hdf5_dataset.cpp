// The `hdf5` dataset: /x float [N, D]; /y float [N, C] (regression) or integer [N] (labels);
// optional /x_test and /y_test of the same kinds. Rows are read on demand, one hyperslab per run
// of consecutive requested rows, so files larger than memory work and shuffled reads stay correct.
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "data/dataset.hpp"

namespace mlptrain {

namespace {

struct ArrayInfo {
  std::vector<hsize_t> shape;
  H5T_class_t type_class = H5T_NO_CLASS;
};

class Hdf5Dataset final : public Dataset {
 public:
  Hdf5Dataset(const std::string& path, std::int64_t input_dim, std::int64_t output_dim)
      : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ignored;
    if (!fs::exists(path, ignored)) throw UsageError("--data-path: no such file '" + path + "'");
    if (H5Fis_hdf5(path.c_str()) <= 0)
      throw UsageError("--data-path: '" + path + "' is not an HDF5 file");
    file_ = file_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_.valid()) throw UsageError("--data-path: cannot open '" + path + "'");

    info_.name = "hdf5";
    const ArrayInfo x = describe("/x", true);
    const ArrayInfo y = describe("/y", true);
    check_inputs("/x", x);
    info_.train_size = static_cast<std::int64_t>(x.shape[0]);
    info_.input_dim = static_cast<std::int64_t>(x.shape[1]);
    info_.kind = y.type_class == H5T_INTEGER ? TargetKind::classification : TargetKind::regression;
    check_targets("/y", y, info_.train_size);
    std::int64_t classes_seen = 0;
    if (info_.kind == TargetKind::classification) {
      classes_seen = largest_label("/y", info_.train_size) + 1;
      info_.output_dim = classes_seen;
    } else {
      info_.output_dim = static_cast<std::int64_t>(y.shape[1]);
    }

    const bool has_x_test = exists("/x_test"), has_y_test = exists("/y_test");
    if (has_x_test != has_y_test)
      throw UsageError("--data-path: '" + path_ + "' has " + (has_x_test ? "/x_test" : "/y_test") +
                       " without " + (has_x_test ? "/y_test" : "/x_test"));
    if (has_x_test) {
      const ArrayInfo x_test = describe("/x_test", true);
      const ArrayInfo y_test = describe("/y_test", true);
      check_inputs("/x_test", x_test);
      if (static_cast<std::int64_t>(x_test.shape[1]) != info_.input_dim)
        throw UsageError("--data-path: /x_test in '" + path_ + "' has " +
                         std::to_string(x_test.shape[1]) + " columns but /x has " +
                         std::to_string(info_.input_dim));
      info_.test_size = static_cast<std::int64_t>(x_test.shape[0]);
      if ((y_test.type_class == H5T_INTEGER) != (info_.kind == TargetKind::classification))
        throw UsageError("--data-path: /y_test in '" + path_ + "' is not of the same kind as /y");
      check_targets("/y_test", y_test, info_.test_size);
      if (info_.kind == TargetKind::classification)
        classes_seen = std::max(classes_seen, largest_label("/y_test", info_.test_size) + 1);
      else if (static_cast<std::int64_t>(y_test.shape[1]) != info_.output_dim)
        throw UsageError("--data-path: /y_test in '" + path_ + "' has " +
                         std::to_string(y_test.shape[1]) + " columns but /y has " +
                         std::to_string(info_.output_dim));
      info_.output_dim = std::max(info_.output_dim, classes_seen);
    }

    if (input_dim > 0 && input_dim != info_.input_dim)
      throw UsageError("--input-dim " + std::to_string(input_dim) + " contradicts '" + path_ +
                       "', whose /x has " + std::to_string(info_.input_dim) + " columns");
    if (output_dim > 0) {
      const bool contradicts = info_.kind == TargetKind::regression ? output_dim != info_.output_dim
                                                                     : output_dim < info_.output_dim;
      if (contradicts)
        throw UsageError("--output-dim " + std::to_string(output_dim) + " contradicts '" + path_ +
                         "', whose " +
                         (info_.kind == TargetKind::regression ? "/y has " : "labels need ") +
                         std::to_string(info_.output_dim) +
                         (info_.kind == TargetKind::regression ? " columns" : " classes"));
      info_.output_dim = output_dim;
    }
  }

  const DatasetInfo& info() const override { return info_; }

  void read(Split split, std::span<const std::int64_t> indices, float* inputs, float* targets,
            std::int32_t* labels) override {
    const bool test = split == Split::test;
    if (inputs != nullptr) read_rows(test ? "/x_test" : "/x", indices, info_.input_dim, inputs);
    if (targets != nullptr) read_rows(test ? "/y_test" : "/y", indices, info_.output_dim, targets);
    if (labels != nullptr) read_rows(test ? "/y_test" : "/y", indices, 1, labels);
  }

 private:
  bool exists(const char* name) const { return H5Lexists(file_.get(), name, H5P_DEFAULT) > 0; }

  ArrayInfo describe(const char* name, bool required) const {
    if (!exists(name)) {
      if (required)
        throw UsageError("--data-path: '" + path_ + "' has no dataset " + name);
      return {};
    }
    Hdf5Handle dataset = dataset_handle(H5Dopen2(file_.get(), name, H5P_DEFAULT));
    if (!dataset.valid())
      throw UsageError("--data-path: " + std::string(name) + " in '" + path_ + "' is not a dataset");
    Hdf5Handle space = dataspace_handle(H5Dget_space(dataset.get()));
    Hdf5Handle type = type_handle(H5Dget_type(dataset.get()));
    ArrayInfo info;
    const int rank = H5Sget_simple_extent_ndims(space.get());
    info.shape.resize(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), info.shape.data(), nullptr);
    info.type_class = H5Tget_class(type.get());
    return info;
  }

  void check_inputs(const char* name, const ArrayInfo& info) const {
    if (info.type_class != H5T_FLOAT || info.shape.size() != 2 || info.shape[0] == 0 ||
        info.shape[1] == 0)
      throw UsageError("--data-path: " + std::string(name) + " in '" + path_ +
                       "' must be a non-empty 2-D float array [samples, features]");
  }

  void check_targets(const char* name, const ArrayInfo& info, std::int64_t samples) const {
    const bool labels = info.type_class == H5T_INTEGER;
    const bool shaped = labels ? info.shape.size() == 1
                               : info.type_class == H5T_FLOAT && info.shape.size() == 2 &&
                                     info.shape[1] > 0;
    if (!shaped)
      throw UsageError("--data-path: " + std::string(name) + " in '" + path_ +
                       "' must be float [samples, outputs] or integer [samples]");
    if (static_cast<std::int64_t>(info.shape[0]) != samples)
      throw UsageError("--data-path: " + std::string(name) + " in '" + path_ + "' has " +
                       std::to_string(info.shape[0]) + " rows but its inputs have " +
                       std::to_string(samples));
  }

  std::int64_t largest_label(const char* name, std::int64_t samples) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(samples));
    std::iota(all.begin(), all.end(), 0);
    std::vector<std::int32_t> labels(all.size());
    read_rows(name, all, 1, labels.data());
    const auto [low, high] = std::minmax_element(labels.begin(), labels.end());
    if (*low < 0)
      throw UsageError("--data-path: " + std::string(name) + " in '" + path_ +
                       "' holds a negative label (" + std::to_string(*low) + ")");
    return *high;
  }

  template <typename T>
  void read_rows(const char* name, std::span<const std::int64_t> indices, std::int64_t columns,
                 T* out) {
    if (indices.empty()) return;
    Hdf5Handle dataset = dataset_handle(H5Dopen2(file_.get(), name, H5P_DEFAULT));
    Hdf5Handle file_space = dataspace_handle(H5Dget_space(dataset.get()));
    const int rank = H5Sget_simple_extent_ndims(file_space.get());
    const hid_t memory_type = std::is_same_v<T, float> ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT32;
    // Read runs of consecutive rows in ascending order, then place each row where it was asked.
    std::vector<std::size_t> order(indices.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return indices[a] < indices[b]; });
    std::vector<T> run_rows;
    for (std::size_t begin = 0; begin < order.size();) {
      std::size_t end = begin + 1;
      while (end < order.size() && indices[order[end]] <= indices[order[end - 1]] + 1) ++end;
      const auto first_row = static_cast<hsize_t>(indices[order[begin]]);
      const auto row_count = static_cast<hsize_t>(indices[order[end - 1]]) - first_row + 1;
      const hsize_t start[2] = {first_row, 0};
      const hsize_t count[2] = {row_count, static_cast<hsize_t>(columns)};
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      Hdf5Handle memory_space = dataspace_handle(H5Screate_simple(rank, count, nullptr));
      run_rows.resize(static_cast<std::size_t>(row_count * columns));
      if (H5Dread(dataset.get(), memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT,
                  run_rows.data()) < 0)
        throw RuntimeFailure("--data-path: cannot read " + std::string(name) + " of '" + path_ + "'");
      for (std::size_t k = begin; k < end; ++k) {
        const std::size_t row = static_cast<std::size_t>(indices[order[k]]) - first_row;
        std::copy_n(run_rows.data() + row * columns, columns, out + order[k] * columns);
      }
      begin = end;
    }
  }

  std::string path_;
  Hdf5Handle file_;
  DatasetInfo info_;
};

}  // namespace

std::unique_ptr<Dataset> open_hdf5_dataset(const std::string& path, std::int64_t input_dim,
                                           std::int64_t output_dim) {
  if (path.empty()) throw UsageError("--dataset hdf5 needs --data-path FILE");
  return std::make_unique<Hdf5Dataset>(path, input_dim, output_dim);
}

}  // namespace mlptrain
