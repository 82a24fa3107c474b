// One array of an `hdf5` dataset file (/x, /y, /x_test or /y_test): its shape and stored type,
// and its rows, either from a copy of the whole array in memory (kept in a compact type: images
// of uint8 stay one byte a pixel) or from the file in one read for all the rows a call asks for.
// Inputs are fed as value * scale + offset, from the array's attributes of those names.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/hdf5_handle.hpp"

namespace mlptrain {

class Hdf5Array {
 public:
  // Opens `name` in `file` (from `path`, for messages). Throws UsageError if it is missing or is
  // not a numeric dataset of one or two dimensions.
  Hdf5Array(hid_t file, std::string name, std::string path);

  const std::string& name() const { return name_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t columns() const { return columns_; }
  int dimensions() const { return dimensions_; }
  bool integer() const { return type_class_ == H5T_INTEGER; }
  double scale() const { return scale_; }
  double offset() const { return offset_; }
  // Bytes the array takes in memory once loaded.
  std::size_t memory_bytes() const;

  // Reads the whole array into memory; later reads never touch the file. As inputs or
  // targets (`labels` false) every fed value must be finite, as labels they must be at least 0:
  // the first row that is not throws UsageError naming the array, the file and the row.
  void load(bool labels);
  bool loaded() const { return loaded_; }

  // The rows `indices`, in that order, into `out` (columns values each): as float, scaled, or as
  // int32 labels. From the file, a non-finite value throws RuntimeFailure naming the row.
  void read_rows(std::span<const std::int64_t> indices, float* out) const;
  void read_rows(std::span<const std::int64_t> indices, std::int32_t* out) const;

  // "/x in 'file.h5'", for messages.
  std::string where() const;

 private:
  // What a loaded copy keeps: the stored bytes of small unsigned integers, else float or int32.
  enum class Kept { uint8, uint16, float32, int32 };
  template <typename Out>
  void read_rows_from_file(std::span<const std::int64_t> indices, Out* out) const;
  template <typename Out>
  void read_rows_from_memory(std::span<const std::int64_t> indices, Out* out) const;
  void scale_rows(float* out, std::size_t values) const;
  void check_finite(const float* values, std::span<const std::int64_t> rows) const;
  hid_t memory_type(Kept kept) const;

  std::string name_, path_;
  Hdf5Handle dataset_;
  H5T_class_t type_class_ = H5T_NO_CLASS;
  std::size_t type_bytes_ = 0;
  bool type_signed_ = false;
  int dimensions_ = 0;
  std::int64_t rows_ = 0, columns_ = 1;
  double scale_ = 1, offset_ = 0;
  bool loaded_ = false;
  Kept kept_ = Kept::float32;
  std::vector<std::byte> memory_;
};

}  // namespace mlptrain
