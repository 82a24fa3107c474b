// A chunk's forward (see forward_runner.hpp).
#include "train/forward_runner.hpp"

#include <algorithm>
#include <utility>

namespace mlptrain {

void ForwardRunner::layer(MicroBatchActivations& activations, std::size_t local, void* scratch, const Pass& pass) {
  const LayerSpec& spec = layers_.spec(local);
  const LayerCall call = tools_.call(layers_.global(local), spec, pass.micro_batch, pass.micro_batches, pass.training);
  if (gate_) gate_(call.layer);
  ForwardStart start(call, pass.recomputing, layers_.input_rows(activations, local), layers_.input_of(activations, local),
                     layers_.unit(local, false));
  tools_.strategies.before_layer_forward(start);
  const ChunkLayers::Placed placed = layers_.place(local, start.unit);
  // The layer's outputs, for the rows they have (a recomputed layer's kept ones stay).
  const std::int64_t layer_rows = start.layer_rows(), output_rows = start.output_rows(), out = spec.out_features;
  activations.layer_rows[local] = layer_rows;
  activations.output_rows[local] = output_rows;
  if (activations.pre[local].empty()) activations.pre[local] = tools_.allocate_rows(MemoryState::activations, output_rows, out);
  if (spec.gelu && scratch == nullptr && activations.output[local].empty())
    activations.output[local] = tools_.allocate_rows(MemoryState::activations, output_rows, out);
  void* output = scratch != nullptr ? scratch : activations.output[local].as<void>();
  void* pre = activations.pre[local].as<void>();
  // The product has the rows the layer computes on; with other output rows it is transient.
  Buffer product_rows;
  if (output_rows != layer_rows) product_rows = tools_.allocate_rows(MemoryState::workspace, layer_rows, out);
  void* product = product_rows.empty() ? pre : product_rows.as<void>();
  const ForwardProduct computed{
      call, layer_rows, output_rows, product, pre,
      start.bias_after_sum() ? std::optional<const void*>(placed.linear.bias) : std::nullopt};
  if (const std::optional<MoeLayer>& moe = layers_.moe(local)) {
    const MoeLayer::Pass moe_pass{tools_.kernels, tools_.allocator, tools_.strategies.expert_exchange(), &placed.moe};
    moe->forward(moe_pass, start.layer_input(), layer_rows, product, activations.moe[local],
                 pass.training ? &moe_statistics_ : nullptr);
    tools_.strategies.after_layer_matmul(computed);
  } else {
    tools_.forward_product(call, placed.linear, start.layer_input(), layer_rows, product,
                           start.bias_after_sum() ? BiasPlace::after_sum : BiasPlace::in_product);
    tools_.strategies.after_layer_matmul(computed);
    linear_forward_finish(tools_.kernels, placed.linear, output_rows, pre, spec.gelu ? output : pre);
  }
  tools_.strategies.after_layer_forward(ForwardDone{call});
}

void ForwardRunner::forward(MicroBatchActivations& activations, const Pass& pass) {
  const std::size_t count = layers_.size();
  activations.pre.resize(count);
  activations.output.resize(count);
  activations.moe.resize(count);
  activations.layer_rows.resize(count);
  activations.output_rows.resize(count);
  for (std::size_t local = 0; local < count; ++local) {
    layer(activations, local, nullptr, pass);
    // What backward will not read (or will recompute) goes now; the stage's output stays.
    if (layers_.spec(local).gelu && !plan_.keeps_pre(local, pass.training)) activations.pre[local] = Buffer{};
    if (!plan_.keeps_input(local, pass.training)) {
      activations.output[local - 1] = Buffer{};
      activations.pre[local - 1] = Buffer{};
    }
  }
  if (!pass.training) return;
  std::int64_t moe_bytes = 0;
  for (const MoeActivations& moe : activations.moe) moe_bytes += moe.bytes();
  largest_moe_bytes_ = std::max(largest_moe_bytes_, moe_bytes);
}

MoeStatistics ForwardRunner::take_moe_statistics() {
  MoeStatistics taken = std::move(moe_statistics_);
  moe_statistics_.clear();
  return taken;
}

}  // namespace mlptrain
