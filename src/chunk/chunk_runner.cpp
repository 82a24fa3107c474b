// A chunk's micro-batches forward and backward (see chunk_runner.hpp).
#include "chunk/chunk_runner.hpp"

#include <algorithm>

namespace mlptrain {

ChunkRunner::ChunkRunner(Kernels& kernels, Allocator& allocator, const ParameterStore& parameters,
                         const std::vector<LayerSpec>& specs, LayerRange chunk, StrategyStack& strategies,
                         const MoeSettings& moe, bool recompute)
    : tools_{kernels, allocator, strategies, parameters.precision().param},
      layers_(parameters, specs, chunk, moe),
      plan_(layers_.specs(), recompute),
      step_(tools_, layers_) {}

MicroBatchActivations ChunkRunner::prepare(std::int64_t rows, LossKind loss_kind) {
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

LossSums ChunkRunner::forward(MicroBatchActivations& activations, int micro_batch, int micro_batches, bool training,
                              LossKind loss_kind, std::int64_t loss_samples, float loss_scale) {
  const std::size_t count = layers_.size();
  activations.pre.resize(count);
  activations.output.resize(count);
  activations.moe.resize(count);
  activations.layer_rows.resize(count);
  activations.output_rows.resize(count);
  activations.fp8_amax.resize(count);
  for (std::size_t local = 0; local < count; ++local) {
    step_.forward(activations, local, nullptr,
                  {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = training});
    // What backward will not read (or will recompute) goes now; the stage's output stays.
    if (layers_.spec(local).gelu && !plan_.keeps_pre(local, training)) activations.pre[local] = Buffer{};
    if (!plan_.keeps_input(local, training)) {
      activations.output[local - 1] = Buffer{};
      activations.pre[local - 1] = Buffer{};
    }
  }
  if (training) {
    std::int64_t moe_bytes = 0;
    for (const MoeActivations& moe : activations.moe) moe_bytes += moe.bytes();
    largest_moe_bytes_ = std::max(largest_moe_bytes_, moe_bytes);
  }
  if (!computes_loss()) return {};
  return loss(activations, training, loss_kind, loss_samples, loss_scale);
}

LossSums ChunkRunner::loss(MicroBatchActivations& activations, bool training, LossKind loss_kind,
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
  if (!widened) return sums;
  // The last layer's fp8 d(pre) is this gradient: its amax taken as it is rounded.
  const std::size_t last = layers_.size() - 1;
  if (step_.takes_fp8_amax(last) && !layers_.spec(last).gelu) {
    SharedAmax& shared = activations.fp8_amax[last].output_grad;
    if (shared.value.empty()) shared.value = tools_.allocator.allocate_floats(MemoryState::workspace, 1);
    kernels.convert_amax(grad, DataType::float32, activations.loss_grad.as<void>(), type, count, shared.value.floats());
    shared.state = AmaxState::local;
    return sums;
  }
  kernels.convert(grad, DataType::float32, activations.loss_grad.as<void>(), type, count);
  return sums;
}

void ChunkRunner::recompute_segment(MicroBatchActivations& activations, std::size_t first, std::size_t last,
                                    void* scratch, int micro_batch, int micro_batches) {
  for (std::size_t local = first; local <= last; ++local) {
    if (!activations.pre[local].empty()) continue;  // kept by forward
    step_.forward(activations, local, local < last ? nullptr : scratch,
                  {.micro_batch = micro_batch, .micro_batches = micro_batches, .training = true, .recomputing = true});
  }
}

void ChunkRunner::walk_back(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                            BackwardPart part) {
  const std::int64_t rows = activations.rows;
  std::int64_t widest = 0, most_rows = rows;
  for (std::size_t local = 0; local < layers_.size(); ++local)
    widest = std::max({widest, layers_.spec(local).in_features, layers_.spec(local).out_features});
  for (std::int64_t layer_rows : activations.layer_rows) most_rows = std::max(most_rows, layer_rows);
  // Three rotating gradient buffers: the incoming gradient, d loss / d pre (and a recomputed
  // segment's discarded last output before that), and the outgoing one.
  Buffer workspace[3];
  for (Buffer& buffer : workspace) buffer = tools_.allocate_rows(MemoryState::workspace, most_rows, widest);
  const void* grad_output = layers_.ends_model() ? activations.loss_grad.as<void>() : activations.output_grad.as<void>();
  if (!layers_.starts_model())
    activations.input_grad = tools_.allocate_rows(MemoryState::comm_buffers, rows, layers_.spec(0).in_features);
  // B keeps what W reads: every activation (recomputed ones too) and the products' gradients.
  const bool whole_backward = part == BackwardPart::whole;
  if (!whole_backward) activations.product_grad.resize(layers_.size());
  int outgoing = 0;
  for (std::size_t local = layers_.size(); local-- > 0;) {
    if (plan_.ends_segment(local))
      recompute_segment(activations, plan_.segment_start(local), local,
                        whole_backward ? workspace[2].as<void>() : nullptr, micro_batch, micro_batches);
    const std::optional<void*> grad_input = layers_.global(local) == 0 ? std::nullopt
                                            : local == 0 ? std::optional<void*>(activations.input_grad.as<void>())
                                                         : std::optional<void*>(workspace[outgoing].as<void>());
    // An MoE layer's backward is whole in B as well.
    const BackwardPart layer_part = layers_.moe(local) ? BackwardPart::whole : part;
    BackwardStart start = step_.backward_start(activations, local, micro_batch, micro_batches, layer_part, grad_input);
    step_.backward(activations, local, start, grad_output, workspace[2].as<void>(), loss_scale);
    if (whole_backward) {
      // The layer's activations and its input are read for the last time (the layer below needs
      // only its own input and pre-activation).
      activations.pre[local] = Buffer{};
      activations.output[local] = Buffer{};
      if (local > 0) activations.output[local - 1] = Buffer{};
    }
    grad_output = grad_input.value_or(nullptr);
    outgoing ^= 1;
  }
}

void ChunkRunner::backward(MicroBatchActivations& activations, int micro_batch, int micro_batches, float loss_scale,
                           BackwardPart part) {
  if (part == BackwardPart::weight) {
    for (std::size_t local = layers_.size(); local-- > 0;) {
      if (layers_.moe(local)) continue;
      BackwardStart start =
          step_.backward_start(activations, local, micro_batch, micro_batches, BackwardPart::weight, std::nullopt);
      step_.backward(activations, local, start, nullptr, nullptr, loss_scale);
    }
  } else {
    walk_back(activations, micro_batch, micro_batches, loss_scale, part);
    // B leaves the activations for W; the received gradient has been read.
    if (part == BackwardPart::input) {
      activations.output_grad = Buffer{};
      return;
    }
  }
  Buffer input_grad = std::move(activations.input_grad);
  activations = MicroBatchActivations{};
  activations.input_grad = std::move(input_grad);
}

}  // namespace mlptrain
