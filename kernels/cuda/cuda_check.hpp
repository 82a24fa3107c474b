// A failed CUDA runtime call as the error users read (the backend's files share it).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.hpp"

namespace mlptrain {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(status));
}

}  // namespace mlptrain
