// Loss normalization and dispatch (see loss.hpp).
#include "model/loss.hpp"

namespace mlptrain {

double loss_normalizer(LossKind kind, std::int64_t samples, std::int64_t output_dim) {
  return kind == LossKind::mse ? static_cast<double>(samples) * static_cast<double>(output_dim)
                               : static_cast<double>(samples);
}

LossSums compute_loss(Kernels& kernels, LossKind kind, const float* output, const float* targets,
                      const std::int32_t* labels, std::int64_t rows, std::int64_t output_dim,
                      std::int64_t global_samples, float* grad) {
  const auto grad_scale =
      static_cast<float>(1.0 / loss_normalizer(kind, global_samples, output_dim));
  if (kind == LossKind::mse) {
    return {kernels.mse(output, targets, grad, rows, output_dim, grad_scale), 0};
  }
  const CrossEntropyResult result =
      kernels.cross_entropy(output, labels, grad, rows, output_dim, grad_scale);
  return {result.loss_sum, result.correct};
}

}  // namespace mlptrain
