// A chunk's micro-batches forward and backward (see model_runner.hpp).
#include "train/model_runner.hpp"

namespace mlptrain {

ModelRunner::ModelRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
                         const std::vector<LayerSpec>& specs, LayerRange chunk, StrategyStack& strategies,
                         const MoeSettings& moe, bool recompute)
    : tools_{kernels, allocator, strategies, parameters.precision().param},
      layers_(parameters, specs, chunk, moe),
      plan_(layers_.specs(), recompute),
      forward_(tools_, layers_, plan_),
      backward_(tools_, layers_, plan_, forward_) {}

MicroBatchActivations ModelRunner::prepare(std::int64_t rows, LossKind loss_kind) {
  MicroBatchActivations activations;
  activations.rows = rows;
  activations.input = tools_.allocate_rows(MemoryState::activations, rows, input_width());
  if (computes_loss()) {
    if (loss_kind == LossKind::mse) {
      activations.targets =
          tools_.allocator.allocate_floats(MemoryState::activations, static_cast<std::size_t>(rows * output_width()));
    } else {
      activations.labels =
          tools_.allocator.allocate(MemoryState::activations, static_cast<std::size_t>(rows) * sizeof(std::int32_t));
    }
  }
  return activations;
}

LossSums ModelRunner::forward(MicroBatchActivations& activations, int micro_batch, int micro_batches, bool training,
                              LossKind loss_kind, std::int64_t loss_samples, float loss_scale) {
  forward_.forward(activations, {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = training});
  if (!computes_loss()) return {};
  return loss(activations, training, loss_kind, loss_samples, loss_scale);
}

LossSums ModelRunner::loss(MicroBatchActivations& activations, bool training, LossKind loss_kind,
                           std::int64_t loss_samples, float loss_scale) {
  Kernels& kernels = tools_.kernels;
  const DataType type = tools_.activation_type;
  const std::int64_t rows = activations.rows, outputs = output_width();
  const auto count = static_cast<std::size_t>(rows * outputs);
  if (training) activations.loss_grad = tools_.allocate_rows(MemoryState::activations, rows, outputs);
  // fp32 output and gradient: the layer's own memory, or widened copies in the workspace.
  const bool widened = type != DataType::float32;
  Buffer output32, grad32;
  if (widened) {
    output32 = tools_.allocator.allocate_floats(MemoryState::workspace, count);
    kernels.convert(output(activations), type, output32.floats(), DataType::float32, count);
    if (training) grad32 = tools_.allocator.allocate_floats(MemoryState::workspace, count);
  }
  float* grad = !training ? nullptr : widened ? grad32.floats() : activations.loss_grad.floats();
  const LossSums sums =
      compute_loss(kernels, loss_kind, widened ? output32.floats() : static_cast<const float*>(output(activations)),
                   activations.targets.floats(), activations.labels.as<std::int32_t>(), rows, outputs, loss_samples,
                   grad);
  if (grad == nullptr) return sums;
  // The backward starts from the loss's gradient: the targets are not needed past this point,
  // and a loss stage holding several micro-batches (a V's stage 0) should not keep them.
  activations.targets.reset();
  activations.labels.reset();
  if (loss_scale != 1.0f) kernels.scale(grad, count, loss_scale);
  if (widened) kernels.convert(grad, DataType::float32, activations.loss_grad.as<void>(), type, count);
  return sums;
}

}  // namespace mlptrain
