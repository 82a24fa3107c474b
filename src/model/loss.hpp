// The task losses: MSE (mean over samples and output dimensions) for float targets and softmax
// cross-entropy (mean over samples) for integer labels. A step's loss is the mean over its whole
// global batch however it is split, so local sums and gradients are scaled by the global count.
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"

namespace mlptrain {

enum class LossKind { mse, cross_entropy };

struct LossSums {
  double loss_sum = 0;       // un-normalized: divide by loss_normalizer for the mean
  std::int64_t correct = 0;  // classification only
};

// What a loss sum is divided by to give the mean over `samples` samples.
double loss_normalizer(LossKind kind, std::int64_t samples, std::int64_t output_dim);

// Loss sums of a local slice; writes d(mean loss over global_samples)/d(output) into grad unless
// grad is null.
LossSums compute_loss(Kernels& kernels, LossKind kind, const float* output, const float* targets,
                      const std::int32_t* labels, std::int64_t rows, std::int64_t output_dim,
                      std::int64_t global_samples, float* grad);

}  // namespace mlptrain
