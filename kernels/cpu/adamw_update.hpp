// The CPU's AdamW (Kernels::adamw): the update of `count` elements, spread over the rank's GEMM
// threads in fixed chunks, returning the sum of squares of the gradients it read.
#pragma once

#include <cstddef>

#include "core/data_type.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

double adamw_update(float* master, const void* grads, DataType grads_type, float* exp_avg, float* exp_avg_sq,
                    std::size_t count, const AdamWStep& step, void* compute_copy, DataType compute_type);

}  // namespace mlptrain
