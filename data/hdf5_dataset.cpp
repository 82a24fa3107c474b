// The `hdf5` dataset: /x [N, D] of any numeric type (uint8 images stay one byte a pixel, fed
// as x * scale + offset from the array's attributes); /y float [N, C] (regression) or integer
// [N] (labels); optional /x_test and /y_test of the same kinds. When the arrays fit under the
// memory cap they are read once, whole, and every batch comes from memory; otherwise each batch
// reads the rows it needs from the file (hdf5_array.hpp), so files larger than memory work.
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "data/dataset.hpp"
#include "data/hdf5_array.hpp"

namespace mlptrain {

namespace {

class Hdf5Dataset final : public Dataset {
 public:
  explicit Hdf5Dataset(const DataOptions& options) : path_(options.path) {
    namespace fs = std::filesystem;
    std::error_code ignored;
    if (!fs::exists(path_, ignored)) throw UsageError("--data-path: no such file '" + path_ + "'");
    if (H5Fis_hdf5(path_.c_str()) <= 0)
      throw UsageError("--data-path: '" + path_ + "' is not an HDF5 file");
    file_ = file_handle(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_.valid()) throw UsageError("--data-path: cannot open '" + path_ + "'");

    info_.name = "hdf5";
    x_.emplace(file_.get(), "/x", path_);
    y_.emplace(file_.get(), "/y", path_);
    check_inputs(*x_);
    info_.train_size = x_->rows();
    info_.input_dim = x_->columns();
    info_.kind = y_->integer() ? TargetKind::classification : TargetKind::regression;
    const bool labels = info_.kind == TargetKind::classification;
    check_targets(*y_, info_.train_size);
    // Labels are always held in memory: the class count needs all of them, and they are small.
    if (labels) y_->load(true);
    info_.output_dim = labels ? largest_label(*y_) + 1 : y_->columns();

    const bool has_x_test = exists("/x_test"), has_y_test = exists("/y_test");
    if (has_x_test != has_y_test)
      throw UsageError("--data-path: '" + path_ + "' has " + (has_x_test ? "/x_test" : "/y_test") +
                       " without " + (has_x_test ? "/y_test" : "/x_test"));
    if (has_x_test) {
      x_test_.emplace(file_.get(), "/x_test", path_);
      y_test_.emplace(file_.get(), "/y_test", path_);
      check_inputs(*x_test_);
      if (x_test_->columns() != info_.input_dim)
        throw UsageError("--data-path: " + x_test_->where() + " has " + std::to_string(x_test_->columns()) +
                         " columns but /x has " + std::to_string(info_.input_dim));
      info_.test_size = x_test_->rows();
      if (y_test_->integer() != labels)
        throw UsageError("--data-path: " + y_test_->where() + " is not of the same kind as /y");
      check_targets(*y_test_, info_.test_size);
      if (labels) {
        y_test_->load(true);
        info_.output_dim = std::max(info_.output_dim, largest_label(*y_test_) + 1);
      } else if (y_test_->columns() != info_.output_dim) {
        throw UsageError("--data-path: " + y_test_->where() + " has " + std::to_string(y_test_->columns()) +
                         " columns but /y has " + std::to_string(info_.output_dim));
      }
    }
    check_dimensions(options.input_dim, options.output_dim);
    load_when_it_fits(options.memory_cap_bytes);
  }

  const DatasetInfo& info() const override { return info_; }
  // Loaded arrays, and those read with pread, are read without the HDF5 library.
  bool readable_from_any_thread() const override {
    if (in_memory_) return true;
    for (const std::optional<Hdf5Array>* array : {&x_, &y_, &x_test_, &y_test_})
      if (array->has_value() && !(*array)->loaded() && !(*array)->read_directly()) return false;
    return true;
  }
  bool reads_from_file() const override { return !in_memory_; }

  void read(Split split, std::span<const std::int64_t> indices, float* inputs, float* targets,
            std::int32_t* labels) override {
    const bool test = split == Split::test;
    if (test && !x_test_) throw UsageError("--data-path: '" + path_ + "' has no test split");
    const Hdf5Array& x = test ? *x_test_ : *x_;
    const Hdf5Array& y = test ? *y_test_ : *y_;
    if (inputs != nullptr) x.read_rows(indices, inputs);
    if (targets != nullptr) y.read_rows(indices, targets);
    if (labels != nullptr) y.read_rows(indices, labels);
  }

 private:
  bool exists(const char* name) const { return H5Lexists(file_.get(), name, H5P_DEFAULT) > 0; }

  static void check_inputs(const Hdf5Array& x) {
    if (x.dimensions() != 2 || x.rows() == 0 || x.columns() == 0)
      throw UsageError("--data-path: " + x.where() + " must be a non-empty 2-D numeric array [samples, features]");
  }

  static void check_targets(const Hdf5Array& y, std::int64_t samples) {
    if (y.integer() ? y.dimensions() != 1 : y.dimensions() != 2 || y.columns() == 0)
      throw UsageError("--data-path: " + y.where() + " must be float [samples, outputs] or integer [samples]");
    if (y.rows() != samples)
      throw UsageError("--data-path: " + y.where() + " has " + std::to_string(y.rows()) +
                       " rows but its inputs have " + std::to_string(samples));
  }

  static std::int64_t largest_label(const Hdf5Array& y) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(y.rows()));
    std::iota(all.begin(), all.end(), 0);
    std::vector<std::int32_t> labels(all.size());
    y.read_rows(all, labels.data());
    return *std::max_element(labels.begin(), labels.end());
  }

  void check_dimensions(std::int64_t input_dim, std::int64_t output_dim) {
    if (input_dim > 0 && input_dim != info_.input_dim)
      throw UsageError("--input-dim " + std::to_string(input_dim) + " contradicts '" + path_ +
                       "', whose /x has " + std::to_string(info_.input_dim) + " columns");
    if (output_dim <= 0) return;
    const bool regression = info_.kind == TargetKind::regression;
    if (regression ? output_dim != info_.output_dim : output_dim < info_.output_dim)
      throw UsageError("--output-dim " + std::to_string(output_dim) + " contradicts '" + path_ + "', whose " +
                       (regression ? "/y has " : "labels need ") + std::to_string(info_.output_dim) +
                       (regression ? " columns" : " classes"));
    info_.output_dim = output_dim;
  }

  // Every array into memory when together they fit under the cap; otherwise each read goes to
  // the file (one read per array and call).
  void load_when_it_fits(std::int64_t cap_bytes) {
    std::vector<Hdf5Array*> arrays = {&*x_, &*y_};
    if (x_test_) arrays.insert(arrays.end(), {&*x_test_, &*y_test_});
    std::int64_t bytes = 0;
    for (const Hdf5Array* array : arrays) bytes += static_cast<std::int64_t>(array->memory_bytes());
    info_.memory_bytes = bytes;
    in_memory_ = held_in_memory(info_, cap_bytes);
    if (!in_memory_) return;
    for (Hdf5Array* array : arrays)
      if (!array->loaded()) array->load(false);
  }

  std::string path_;
  Hdf5Handle file_;
  DatasetInfo info_;
  std::optional<Hdf5Array> x_, y_, x_test_, y_test_;
  bool in_memory_ = false;
};

}  // namespace

std::unique_ptr<Dataset> open_hdf5_dataset(const DataOptions& options) {
  if (options.path.empty()) throw UsageError("--dataset hdf5 needs --data-path FILE");
  return std::make_unique<Hdf5Dataset>(options);
}

}  // namespace mlptrain
