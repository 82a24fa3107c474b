// Owning wrapper for HDF5 identifiers, so every early exit (and every error path) closes what it
// opened. HDF5's own error-stack printing is switched off by main: errors reach users as one line.
#pragma once

#include <hdf5.h>

#include <utility>

namespace mlptrain {

class Hdf5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Hdf5Handle() = default;
  Hdf5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hdf5Handle(Hdf5Handle&& other) noexcept { *this = std::move(other); }
  Hdf5Handle& operator=(Hdf5Handle&& other) noexcept {
    std::swap(id_, other.id_);
    std::swap(closer_, other.closer_);
    return *this;
  }
  Hdf5Handle(const Hdf5Handle&) = delete;
  Hdf5Handle& operator=(const Hdf5Handle&) = delete;
  ~Hdf5Handle() {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now, reporting failure (a close that flushes data can fail).
  bool close() {
    const herr_t status = id_ >= 0 && closer_ != nullptr ? closer_(id_) : 0;
    id_ = -1;
    return status >= 0;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline Hdf5Handle file_handle(hid_t id) { return {id, H5Fclose}; }
inline Hdf5Handle dataset_handle(hid_t id) { return {id, H5Dclose}; }
inline Hdf5Handle dataspace_handle(hid_t id) { return {id, H5Sclose}; }
inline Hdf5Handle property_handle(hid_t id) { return {id, H5Pclose}; }
inline Hdf5Handle type_handle(hid_t id) { return {id, H5Tclose}; }
inline Hdf5Handle attribute_handle(hid_t id) { return {id, H5Aclose}; }
inline Hdf5Handle group_handle(hid_t id) { return {id, H5Gclose}; }

inline void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace mlptrain
