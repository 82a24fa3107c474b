// Scalar attribute helpers (see hdf5_attributes.hpp).
#include "io/hdf5_attributes.hpp"

#include "core/hdf5_handle.hpp"

namespace mlptrain {

namespace {
bool write_scalar(hid_t object, const char* name, hid_t file_type, hid_t memory_type,
                  const void* value) {
  // An attribute already there (of the same type) is written over in place.
  Hdf5Handle space = dataspace_handle(H5Screate(H5S_SCALAR));
  Hdf5Handle attribute = attribute_handle(
      H5Aexists(object, name) > 0 ? H5Aopen(object, name, H5P_DEFAULT)
                                  : H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  return attribute.valid() && H5Awrite(attribute.get(), memory_type, value) >= 0;
}
}  // namespace

bool write_string_attribute(hid_t object, const char* name, const std::string& value) {
  Hdf5Handle type = type_handle(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* text = value.c_str();
  return write_scalar(object, name, type.get(), type.get(), &text);
}

bool write_int64_attribute(hid_t object, const char* name, std::int64_t value) {
  return write_scalar(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

bool write_uint32_attribute(hid_t object, const char* name, std::uint32_t value) {
  return write_scalar(object, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}

bool write_double_attribute(hid_t object, const char* name, double value) {
  return write_scalar(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

std::optional<std::string> read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Hdf5Handle attribute = attribute_handle(H5Aopen(object, name, H5P_DEFAULT));
  Hdf5Handle file_type = type_handle(H5Aget_type(attribute.get()));
  if (H5Tget_class(file_type.get()) != H5T_STRING) return std::nullopt;
  Hdf5Handle type = type_handle(H5Tcopy(H5T_C_S1));
  H5Tset_cset(type.get(), H5Tget_cset(file_type.get()));  // no conversion between character sets
  if (H5Tis_variable_str(file_type.get()) > 0) {
    H5Tset_size(type.get(), H5T_VARIABLE);
    char* text = nullptr;
    if (H5Aread(attribute.get(), type.get(), &text) < 0 || text == nullptr) return std::nullopt;
    std::string value(text);
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(file_type.get());
  H5Tset_size(type.get(), size + 1);
  std::string value(size + 1, '\0');
  if (H5Aread(attribute.get(), type.get(), value.data()) < 0) return std::nullopt;
  value.resize(value.find('\0'));
  return value;
}

namespace {
// A scalar attribute of `type_class`, converted to `memory_type`.
template <typename T>
std::optional<T> read_scalar(hid_t object, const char* name, H5T_class_t type_class, hid_t memory_type) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Hdf5Handle attribute = attribute_handle(H5Aopen(object, name, H5P_DEFAULT));
  Hdf5Handle file_type = type_handle(H5Aget_type(attribute.get()));
  if (H5Tget_class(file_type.get()) != type_class) return std::nullopt;
  T value{};
  if (H5Aread(attribute.get(), memory_type, &value) < 0) return std::nullopt;
  return value;
}
}  // namespace

std::optional<std::int64_t> read_int64_attribute(hid_t object, const char* name) {
  return read_scalar<std::int64_t>(object, name, H5T_INTEGER, H5T_NATIVE_INT64);
}

std::optional<double> read_double_attribute(hid_t object, const char* name) {
  return read_scalar<double>(object, name, H5T_FLOAT, H5T_NATIVE_DOUBLE);
}

}  // namespace mlptrain
