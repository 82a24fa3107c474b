// Reading and writing the scalar attributes of checkpoints: variable-length UTF-8 strings (read
// back by h5py as str), 64-bit integers, doubles and 32-bit checksums.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mlptrain {

// Each creates the attribute, or writes over one already there.
bool write_string_attribute(hid_t object, const char* name, const std::string& value);
bool write_int64_attribute(hid_t object, const char* name, std::int64_t value);
bool write_uint32_attribute(hid_t object, const char* name, std::uint32_t value);
bool write_double_attribute(hid_t object, const char* name, double value);

std::optional<std::string> read_string_attribute(hid_t object, const char* name);
std::optional<std::int64_t> read_int64_attribute(hid_t object, const char* name);
std::optional<double> read_double_attribute(hid_t object, const char* name);

}  // namespace mlptrain
