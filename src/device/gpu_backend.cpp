// Loading the GPU backend module (see gpu_backend.hpp).
#include "device/gpu_backend.hpp"

#include <dlfcn.h>

#include <filesystem>

namespace mlptrain {

namespace {

constexpr const char* module_name = "libmlptrain_gpu.so";
constexpr const char* entry_name = "mlptrain_gpu_functions";

}  // namespace

std::shared_ptr<const GpuBackend> GpuBackend::load(std::string* why_not) {
#ifdef MLPTRAIN_HAVE_CUDA
  std::error_code error;
  const std::filesystem::path beside = std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / module_name;
  void* handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = dlopen(module_name, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    if (why_not != nullptr) *why_not = std::string("cannot load ") + module_name + ": " + dlerror();
    return nullptr;
  }
  using Entry = const GpuFunctions* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(handle, entry_name));
  if (entry == nullptr) {
    if (why_not != nullptr) *why_not = std::string(module_name) + " has no " + entry_name;
    dlclose(handle);
    return nullptr;
  }
  return std::shared_ptr<const GpuBackend>(new GpuBackend(handle, *entry()));
#else
  if (why_not != nullptr) *why_not = "this build has no CUDA backend (nvcc was not found when it was configured)";
  return nullptr;
#endif
}

GpuBackend::~GpuBackend() { dlclose(handle_); }

}  // namespace mlptrain
