// Preloaded into mlptrain by tests (LD_PRELOAD): a pwrite of 1 MiB or more into a file whose name
// ends in ".partial" fails with ENOSPC, as on a full disk. A checkpoint's frame (small writes by
// the HDF5 library) is made; the slices' writes behind training then fail.
#undef _FILE_OFFSET_BITS  // so that pwrite and pwrite64 are two functions here, as in the C library
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

namespace {

bool refused(int descriptor, size_t bytes) {
  if (bytes < (size_t{1} << 20)) return false;
  char link[64], target[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", descriptor);
  const ssize_t length = readlink(link, target, sizeof target - 1);
  constexpr size_t suffix = sizeof ".partial" - 1;
  return length >= static_cast<ssize_t>(suffix) && std::memcmp(target + length - suffix, ".partial", suffix) == 0;
}

using Pwrite = ssize_t (*)(int, const void*, size_t, off_t);

ssize_t write_or_refuse(const char* name, int descriptor, const void* data, size_t bytes, off_t offset) {
  if (refused(descriptor, bytes)) {
    errno = ENOSPC;
    return -1;
  }
  const auto next = reinterpret_cast<Pwrite>(dlsym(RTLD_NEXT, name));
  return next(descriptor, data, bytes, offset);
}

}  // namespace

extern "C" ssize_t pwrite(int descriptor, const void* data, size_t bytes, off_t offset) {
  return write_or_refuse("pwrite", descriptor, data, bytes, offset);
}

extern "C" ssize_t pwrite64(int descriptor, const void* data, size_t bytes, off64_t offset) {
  return write_or_refuse("pwrite64", descriptor, data, bytes, offset);
}
