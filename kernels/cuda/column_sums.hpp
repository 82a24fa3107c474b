// Column sums at HBM speed (the bias gradient), in two stages: blocks of rows sum their tiles'
// columns into fp32 partials, then one thread per column adds its partials in block order and
// rounds once into the sums. With GELU's backward, the first stage also writes the gradient of
// the pre-activation, summing the rounded values it stores: one pass where there were two.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/data_type.hpp"
#include "kernels/cuda/device_scratch.hpp"

namespace mlptrain {

// sums (of sums_type) = (or +=) the column sums of `data` [rows, cols] (of `type`); with `pre`,
// of grad_pre = round(data * GELU'(pre)), stored into `grad_pre` as they are summed (and, with
// `amax`, their largest magnitude taken on the way).
struct ColumnSumsCall {
  const void* data = nullptr;
  const void* pre = nullptr;  // null: plain column sums
  void* grad_pre = nullptr;
  DataType type = DataType::float32;
  void* sums = nullptr;
  DataType sums_type = DataType::float32;
  bool accumulate = false;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  float* amax = nullptr;  // with `pre`: the largest |grad_pre| as stored, where asked
};

struct ColumnSums {
  cudaStream_t stream;
  DeviceScratch& scratch;  // the partials
  int multiprocessors;     // blocks of rows enough to fill these several times over

  void run(const ColumnSumsCall& call) const;
};

}  // namespace mlptrain
