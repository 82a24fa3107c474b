// The layout-wide terms of the cost model (see base_cost.hpp).
#include "cost/base_cost.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "model/moe.hpp"
#include "model/recompute_plan.hpp"

namespace mlptrain {

namespace {

int layer_count(const RankLayout& layout) { return static_cast<int>(layout.model.size()); }

LayerRange chunk_of(const RankLayout& layout, int chunk) { return layout.layers.chunks.at(static_cast<std::size_t>(chunk)); }

std::vector<LayerSpec> chunk_specs(const RankLayout& layout, int chunk) {
  std::vector<LayerSpec> specs;
  for (int layer = chunk_of(layout, chunk).first; layer < chunk_of(layout, chunk).last; ++layer)
    specs.push_back(layout.local_spec(layer));
  return specs;
}

// Experts of an MoE layer this rank holds (its expert weights' first dimension).
int local_experts(const RankLayout& layout, int layer) {
  const std::string weight = layer_path(layer, static_cast<int>(layout.model.size())) + "/experts/weight";
  for (const ParameterTensor& tensor : layout.tensors)
    if (tensor.path == weight) return static_cast<int>(tensor.local_shape[0]);
  return layout.model[static_cast<std::size_t>(layer)].experts;
}

}  // namespace

ActivationProfile activation_profile(const RankLayout& layout, const RoutingSeen& routing, int chunk) {
  const std::vector<LayerSpec> specs = chunk_specs(layout, chunk);
  const bool computes_loss = chunk_of(layout, chunk).last == layer_count(layout);
  const std::size_t first_local = static_cast<std::size_t>(layout.layers.local_index(chunk_of(layout, chunk).first));
  const std::int64_t moe_seen = static_cast<std::size_t>(chunk) < routing.largest_moe_activation_bytes.size()
                                    ? routing.largest_moe_activation_bytes[static_cast<std::size_t>(chunk)]
                                    : 0;
  const RecomputePlan plan(specs, layout.config.training.recompute);
  const std::int64_t rows = layout.rows;
  const std::int64_t output_width = specs.back().out_features;
  // Activations and their gradients are of the param type; targets and labels as read.
  const DataType row_type = layout.config.precision.param_dtype;
  const auto row_bytes = static_cast<std::int64_t>(size_of(row_type));
  // What arrives with a micro-batch: its input, and targets or labels where the loss is.
  ActivationProfile profile{.received = rows * specs.front().in_features * row_bytes};
  const std::int64_t targets_bytes =
      !computes_loss ? 0 : layout.loss_kind == LossKind::mse ? rows * output_width * 4 : rows * 4;
  profile.received += targets_bytes;
  // Forward and backward, allocation by allocation, as the runner makes them.
  std::int64_t alive = profile.received, peak = alive;
  const auto allocate = [&](std::int64_t bytes) { peak = std::max(peak, alive += bytes); };
  const auto free = [&](std::int64_t& bytes) { alive -= std::exchange(bytes, 0); };
  const std::size_t count = specs.size();
  std::vector<std::int64_t> pre(count, 0), output(count, 0);
  const auto layer_bytes = [&](std::size_t local) {
    return layout.layer_output_rows(first_local + local) * specs[local].out_features * row_bytes;
  };
  for (std::size_t local = 0; local < count; ++local) {
    allocate(pre[local] = layer_bytes(local));
    if (specs[local].gelu) allocate(output[local] = layer_bytes(local));
    if (specs[local].moe() && moe_seen == 0)
      allocate(moe_activation_bytes(specs[local], local_experts(layout, specs[local].index), layout.shape.ep, rows,
                                    row_type, routing.expert_peak_imbalance));
    if (specs[local].gelu && !plan.keeps_pre(local, true)) free(pre[local]);
    if (!plan.keeps_input(local, true)) {
      free(output[local - 1]);
      free(pre[local - 1]);
    }
  }
  allocate(moe_seen);
  if (computes_loss) {
    allocate(rows * output_width * row_bytes);  // the loss gradient, beside the targets
    alive -= targets_bytes;                     // which the runner then frees
  }
  profile.forward_peak = peak;
  profile.kept = alive;
  // A split backward's B frees nothing: it adds the recomputed activations and each Linear
  // layer's products' gradient (of the micro-batch's rows), all kept for W.
  profile.kept_for_weights = alive;
  for (std::size_t local = count; local-- > 0;) {
    if (plan.ends_segment(local))
      for (std::size_t layer = plan.segment_start(local); layer <= local; ++layer) {
        if (pre[layer] != 0) continue;  // kept by forward
        profile.kept_for_weights += layer_bytes(layer);
        if (specs[layer].gelu && output[layer] == 0) profile.kept_for_weights += layer_bytes(layer);
      }
    if (!specs[local].moe()) profile.kept_for_weights += rows * specs[local].out_features * row_bytes;
  }
  peak = alive;
  for (std::size_t local = count; local-- > 0;) {
    if (plan.ends_segment(local))
      for (std::size_t layer = plan.segment_start(local); layer <= local; ++layer) {
        if (pre[layer] != 0) continue;
        allocate(pre[layer] = layer_bytes(layer));
        if (layer < local && output[layer] == 0) allocate(output[layer] = layer_bytes(layer));
      }
    free(pre[local]);
    free(output[local]);
    if (local > 0) free(output[local - 1]);
  }
  profile.backward_peak = peak;
  return profile;
}

std::int64_t step_sum_values(const RankLayout& layout) {
  const auto moe_layers = std::count_if(layout.model.begin(), layout.model.end(),
                                        [](const LayerSpec& spec) { return spec.moe(); });
  return 7 + (moe_layers > 0 ? 2 + moe_layers * layout.config.model.experts : 0);
}

namespace {

// Per chunk: the bytes of a micro-batch's input and output rows, as they cross a boundary.
struct BoundaryBytes {
  std::vector<std::int64_t> input, output;
};

// The peak of the tensors that exist for a pipeline transfer, following the executor: a chunk
// that receives its output's gradient allocates it when the receive is posted and frees it at
// the end of that micro-batch's backward; a chunk that sends its input's gradient allocates it
// when that backward starts and frees it once the send completes. The executor waits for the
// earlier gradient sends before each of these allocations, so no send's completion time changes
// the peak. (It waits for the chunk's own sends only, and frees their buffers only there.)
std::int64_t transfer_buffer_peak(const RankLayout& layout, const BoundaryBytes& bytes) {
  std::int64_t alive = 0, peak = 0;
  std::vector<std::int64_t> sending(layout.layers.chunks.size(), 0);
  for (const Action& action : layout.schedule) {
    const auto chunk = static_cast<std::size_t>(action.chunk);
    // (B frees the received gradient and allocates the one it sends, as a whole backward does.)
    const bool backward = action.kind == ActionKind::backward || action.kind == ActionKind::backward_input;
    if (action.kind == ActionKind::receive_gradients || backward) alive -= std::exchange(sending[chunk], 0);
    if (action.kind == ActionKind::receive_gradients) peak = std::max(peak, alive += bytes.output[chunk]);
    if (backward && layout.layers.chunks[chunk].first > 0) peak = std::max(peak, alive += bytes.input[chunk]);
    if (backward && layout.layers.chunks[chunk].last < layer_count(layout)) alive -= bytes.output[chunk];
    if (action.kind == ActionKind::send_gradients) sending[chunk] += bytes.input[chunk];
  }
  return peak;
}

}  // namespace

Prediction base_prediction(const RankLayout& layout, const RoutingSeen& routing) {
  Prediction prediction;
  const Precision precision = layout.config.precision.types();
  const auto store_bytes = [&](std::size_t element_bytes) {
    return static_cast<std::int64_t>(layout.store_size() * element_bytes);
  };
  prediction.params.bytes = layout.plan.hold_values ? store_bytes(precision.param_bytes()) : 0;
  prediction.grads.bytes = layout.plan.hold_grads ? store_bytes(precision.reduce_bytes()) : 0;
  // Two moments (and a master, with a 16-bit param type) per parameter the rank updates: every
  // element of its tensors.
  const std::size_t elements = std::accumulate(layout.tensors.begin(), layout.tensors.end(), std::size_t{0},
                                               [](std::size_t sum, const ParameterTensor& tensor) { return sum + tensor.count; });
  prediction.optimizer.bytes = static_cast<std::int64_t>(precision.optimizer_bytes() * elements);
  std::vector<ActivationProfile> profiles;
  for (int chunk = 0; chunk < static_cast<int>(layout.layers.chunks.size()); ++chunk)
    profiles.push_back(activation_profile(layout, routing, chunk));
  prediction.activations.bytes = peak_activation_bytes(layout.schedule, profiles);
  if (layout.shape.world > 1)
    prediction.add_comm(GroupKind::world, CommOp::all_reduce,
                          step_sum_values(layout) * static_cast<std::int64_t>(sizeof(double)));
  // The schedule's transfers across stage boundaries: inputs in, outputs out, and their gradients
  // the other way.
  const auto row_bytes = static_cast<std::int64_t>(precision.param_bytes());
  BoundaryBytes bytes;
  for (const LayerRange& chunk : layout.layers.chunks) {
    bytes.input.push_back(layout.rows * layout.local_spec(chunk.first).in_features * row_bytes);
    bytes.output.push_back(layout.rows * layout.local_spec(chunk.last - 1).out_features * row_bytes);
  }
  for (const Action& action : layout.schedule) {
    const auto chunk = static_cast<std::size_t>(action.chunk);
    if (action.kind == ActionKind::send_activations) prediction.add_comm(GroupKind::pipeline, CommOp::send, bytes.output[chunk]);
    if (action.kind == ActionKind::send_gradients) prediction.add_comm(GroupKind::pipeline, CommOp::send, bytes.input[chunk]);
    if (action.kind == ActionKind::receive_activations) prediction.add_comm(GroupKind::pipeline, CommOp::recv, bytes.input[chunk]);
    if (action.kind == ActionKind::receive_gradients) prediction.add_comm(GroupKind::pipeline, CommOp::recv, bytes.output[chunk]);
  }
  prediction.comm_buffers.bytes = transfer_buffer_peak(layout, bytes);
  return prediction;
}

void finish_prediction(const RankLayout& layout, Prediction& prediction) {
  if (layout.config.training.recompute) prediction.activations.mode = PlacementMode::materialized;
  if (layout.config.device.offload) prediction.optimizer.mode = PlacementMode::offloaded;
}

}  // namespace mlptrain
