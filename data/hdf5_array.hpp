// One array of an `hdf5` dataset file (/x, /y, /x_test or /y_test): its shape and stored type,
// and its rows, either from a copy of the whole array in memory (kept in a compact type: images
// of uint8 stay one byte a pixel) or from the file. An array stored contiguously, unfiltered, in
// a little-endian type of its own (uint8, uint16, int32, int64, fp32, fp64) is read from the file
// with pread at the offset HDF5 gives for it: a row costs what its bytes do, and any thread may
// read. Any other (chunked, compressed, fp16 or bf16) goes through the HDF5 library, in one read
// of all the rows a call asks for. Inputs are fed as value * scale + offset, from the array's
// attributes of those names.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
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
  // Whether rows come from the file without the HDF5 library (and so from any thread).
  bool read_directly() const { return direct_ != Direct::none; }

  // The rows `indices`, in that order, into `out` (columns values each): as float, scaled, or as
  // int32 labels. From the file, a non-finite value throws RuntimeFailure naming the row.
  void read_rows(std::span<const std::int64_t> indices, float* out) const;
  void read_rows(std::span<const std::int64_t> indices, std::int32_t* out) const;

  // "/x in 'file.h5'", for messages.
  std::string where() const;

 private:
  // What a loaded copy keeps: the stored bytes of small unsigned integers, else float or int32.
  enum class Kept { uint8, uint16, float32, int32 };
  // The little-endian types read straight from the file.
  enum class Direct { none, uint8, uint16, int32, int64, float32, float64 };
  template <typename Out>
  void read_rows_from_file(std::span<const std::int64_t> indices, Out* out) const;
  // Distinct rows in ascending order into `rows` (columns values each, as Out).
  template <typename Out>
  void read_distinct_rows(const std::vector<std::int64_t>& rows, std::vector<Out>& read) const;
  template <typename Out>
  void read_directly(const std::vector<std::int64_t>& rows, std::vector<Out>& read) const;
  void find_direct_layout(hid_t type);
  template <typename Out>
  void read_rows_from_memory(std::span<const std::int64_t> indices, Out* out) const;
  // uint8 and uint16 arrays are kept in memory as they are stored.
  bool compact() const { return type_class_ == H5T_INTEGER && !type_signed_ && type_bytes_ <= 2; }
  void scale_rows(float* out, std::size_t values) const;
  // "--data-path: /x in 'f.h5' row 13 holds a non-finite value (nan)".
  std::string non_finite(std::int64_t row, float value) const;
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
  Direct direct_ = Direct::none;
  std::size_t direct_offset_ = 0;  // bytes into the file where the array's first row starts
  std::size_t direct_bytes_ = 0;   // of one stored element
  // The file, opened for pread (closed with the array).
  class Descriptor {
   public:
    Descriptor() = default;
    explicit Descriptor(int value) : value_(value) {}
    Descriptor(Descriptor&& other) noexcept : value_(std::exchange(other.value_, -1)) {}
    Descriptor& operator=(Descriptor&& other) noexcept {
      std::swap(value_, other.value_);
      return *this;
    }
    ~Descriptor();
    int get() const { return value_; }

   private:
    int value_ = -1;
  };
  Descriptor descriptor_;
  Kept kept_ = Kept::float32;
  std::vector<std::byte> memory_;
};

}  // namespace mlptrain
