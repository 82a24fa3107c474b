// The planner's estimate of one layout (see layout_estimate.hpp). The time model, per pipeline
// stage (one rank stands for its stage):
//   forward and backward of a micro-batch: GEMM FLOPs at the cluster's rate for the param type
//     and the share of it the GEMMs' rows reach (an MoE expert's: the rows of balanced routing,
//     the busiest expert rank's work --expert-imbalance times the mean's;
//     backward twice forward, plus recomputation's second forward), bias/GELU passes and MoE
//     layers' row gathers and scatters at the memory-bound rates (cost/flops.hpp), and the
//     communication they wait for: tensor-parallel sums (and
//     sequence parallelism's gathers) and expert exchanges (half in each pass) and the
//     pipeline transfers they send;
//   the pipeline: the stage lists the trainer runs, simulated with those times per model chunk
//     (schedule_timeline), backward as B (input gradient, recomputation, elementwise passes) and
//     W (Linear layers' weight gradients), which gives the bubble of every schedule, split or not;
//   after the last backward: gradient reductions beyond what the last backward hides (all of
//     them on a CPU, where MPI advances only in the ranks' own calls between kernels; on GPUs, data
//     parallelism's buckets, ZeRO stage 1's reduce-scatter and hybrid sharding's sums across
//     replicas start as layers finish, so all but the last layer's share can hide behind it;
//     ZeRO 2-3 reduce every micro-batch behind its backward, stage 3 gathers behind the layer
//     before), ZeRO 1-2's gather after the update, the loop's world sums, and the optimizer at
//     the memory-bound rate.
// Every collective takes latency + bus bytes / bus bandwidth on the link class its group
// crosses, with one latency per layer and micro-batch (per layer for once-a-step reductions).
#include "plan/layout_estimate.hpp"

#include <algorithm>

#include "schedule/schedule_check.hpp"
#include "schedule/schedule_table.hpp"
#include "strategies/pipeline_parallel/pipeline_options.hpp"
#include "strategies/zero/zero_options.hpp"

namespace mlptrain {

bool crosses_nodes(const GridShape& shape, GroupKind kind, int rank, int ranks_per_node) {
  const GridCoordinates place = coordinates_of(shape, rank);
  const auto node = [&](int tp, int dp, int pp) { return rank_of(shape, tp, dp, pp) / ranks_per_node; };
  const int replica_first = place.expert_replica * shape.ep;
  const int shard = shard_ranks(shape), block_first = place.dp / shard * shard, position = place.dp % shard;
  switch (kind) {
    case GroupKind::world: return 0 != (shape.world - 1) / ranks_per_node;
    case GroupKind::tensor: return node(0, place.dp, place.pp) != node(shape.tp - 1, place.dp, place.pp);
    case GroupKind::data: return node(place.tp, 0, place.pp) != node(place.tp, shape.dp - 1, place.pp);
    case GroupKind::expert:
      return node(place.tp, replica_first, place.pp) != node(place.tp, replica_first + shape.ep - 1, place.pp);
    case GroupKind::expert_data:
      return node(place.tp, place.ep, place.pp) != node(place.tp, shape.dp - shape.ep + place.ep, place.pp);
    case GroupKind::data_shard:
      return node(place.tp, block_first, place.pp) != node(place.tp, block_first + shard - 1, place.pp);
    case GroupKind::data_replica:
      return node(place.tp, position, place.pp) != node(place.tp, position + shape.dp - shard, place.pp);
    case GroupKind::expert_data_shard:
      // ep ranks apart inside one shard group, or alone in it (shard sizes that divide ep).
      return shard % shape.ep == 0 && node(place.tp, block_first + place.ep, place.pp) !=
                                          node(place.tp, block_first + shard - shape.ep + place.ep, place.pp);
    case GroupKind::expert_data_replica: {
      // The same place in every shard group, or the whole edp group when shards are single ranks.
      const int first = shard % shape.ep == 0 ? position : place.ep;
      const int step = shard % shape.ep == 0 ? shard : shape.ep;
      return node(place.tp, first, place.pp) != node(place.tp, first + shape.dp - step, place.pp);
    }
    case GroupKind::pipeline: {
      const int here = rank / ranks_per_node;
      return (place.pp > 0 && node(place.tp, place.dp, place.pp - 1) != here) ||
             (place.pp + 1 < shape.pp && node(place.tp, place.dp, place.pp + 1) != here);
    }
  }
  return false;
}

namespace {

// One model chunk's computation per micro-batch, seconds: forward, and backward's two parts (B,
// the input gradient with recomputation and the elementwise passes; W, the weight gradients).
// Schedules that do not split a backward run B + W as one action.
struct ChunkCompute {
  double layers = 0;  // the chunk's share of the stage's layers, for its share of communication
  ComputeTimes times{.forward = 0, .backward_input = 0, .backward_weight = 0};
};

struct StageWork {
  int rank = 0;
  Prediction prediction;
  std::int64_t memory_total = 0;
  LinkBytes bus_bytes;
  std::vector<ChunkCompute> chunks;                  // in the stage's local order
  double forward_compute = 0, backward_compute = 0;  // seconds per micro-batch, over the chunks
  double forward_comm = 0, backward_comm = 0;        // seconds per micro-batch it waits for
  double after_backward = 0;                         // exposed seconds after the pipeline drains
  double optimizer = 0;
  double data = 0;  // seconds a step waits for its samples' inputs
  std::vector<Action> schedule;

  // Each chunk's times with its share of the communication its passes wait for.
  std::vector<ComputeTimes> chunk_times() const {
    std::vector<ComputeTimes> times;
    for (const ChunkCompute& chunk : chunks)
      times.push_back({.forward = chunk.times.forward + forward_comm * chunk.layers,
                       .backward_input = chunk.times.backward_input + backward_comm * chunk.layers,
                       .backward_weight = chunk.times.backward_weight});
    return times;
  }
};

class StageModel {
 public:
  StageModel(const PlanInputs& inputs, double share) : inputs_(inputs), share_(share) {}

  StageWork stage(int pipeline_stage) const {
    const PlanInputs& in = inputs_;
    const int rank = rank_of(in.shape, 0, 0, pipeline_stage);
    const RankLayout layout =
        rank_layout(in.strategies, in.config, in.model, in.shape, coordinates_of(in.shape, rank), in.loss_kind);
    // The busiest expert rank's activations at the routing's most uneven step (its time below
    // follows the mean step's).
    const RoutingSeen planned_routing{.expert_peak_imbalance = in.expert_peak_imbalance};
    StageWork work{.rank = rank, .prediction = predict_rank(in.strategies, layout, planned_routing),
                   .schedule = layout.schedule};
    for (MemoryState state : placed_states) work.memory_total += work.prediction.state(state).bytes;
    compute_times(layout, work);
    communication_times(layout, work);
    return work;
  }

 private:
  void compute_times(const RankLayout& layout, StageWork& work) const {
    const PlanInputs& in = inputs_;
    const auto rows = static_cast<double>(layout.rows);
    const double gemm_rate = in.cluster.gemm_flops_per_s(in.config.precision.param_dtype) * share_;
    // GEMMs of fewer rows run at a smaller share of that rate: a layer's multiply-adds count
    // as many more as its rows' share is short, an MoE layer's at the rows each of its experts
    // gets when the router spreads them evenly (recomputation's at the micro-batch's rows).
    // With --fp8 a dense layer's count as many fewer as the device's fp8 rate is faster (its
    // experts' GEMMs stay in the param type; recomputation runs dense layers alone).
    const double fp8_speedup =
        in.cluster.linear_gemm_flops_per_s(in.config.precision.types()) / (gemm_rate / share_);
    const auto rows_weight = [&](const LayerSpec& spec) {
      const double gemm_rows =
          spec.moe() ? rows * spec.top_k * layout.shape.ep / static_cast<double>(spec.experts) : rows;
      return 1.0 / in.cluster.gemm_rows_share(gemm_rows) / (spec.moe() ? 1.0 : fp8_speedup);
    };
    const double memory_share = in.cluster.memory_bound_share(share_);
    const double elementwise_rate = in.cluster.elementwise_elements_per_s * memory_share;
    const double row_move_rate = in.cluster.row_move_elements_per_s * memory_share;
    const double stage_layers = std::max(1, layout.local_layer_count());
    // Where ranks split an MoE layer's experts, the busiest one's rows set the layer's pace.
    const double expert_share = layout.shape.ep * layout.shape.tp > 1 ? in.expert_imbalance : 1.0;
    for (const LayerRange& range : layout.layers.chunks) {
      std::vector<LayerSpec> specs;
      double multiply_adds = 0, split_multiply_adds = 0, unneeded_input_gradient = 0;
      LayerPasses passes;
      for (int layer = range.first; layer < range.last; ++layer) {
        specs.push_back(layout.local_spec(layer));
        const double cost =
            local_multiply_adds(specs.back(), layout.shape.tp, expert_share) * rows_weight(specs.back());
        multiply_adds += cost;
        // A Linear layer's weight gradient can run apart (W); an MoE layer's backward is one B.
        if (!specs.back().moe()) split_multiply_adds += cost;
        // Nothing needs the gradient of the model's inputs: the first layer does not compute it.
        if (layer == 0) unneeded_input_gradient = cost;
        passes += layer_passes(specs.back(), layout.shape.ep, layout.shape.tp, expert_share);
      }
      ChunkCompute chunk{.layers = range.count() / stage_layers};
      chunk.times.forward = 2 * multiply_adds * rows / gemm_rate + passes.elementwise_forward * rows / elementwise_rate +
                            passes.moved_forward * rows / row_move_rate;
      chunk.times.backward_weight = 2 * split_multiply_adds * rows / gemm_rate;
      chunk.times.backward_input =
          (4 * multiply_adds - 2 * split_multiply_adds - 2 * unneeded_input_gradient +
           recompute_flops_per_sample(specs, in.config.training.recompute) / in.cluster.gemm_rows_share(rows) /
               fp8_speedup) *
              rows / gemm_rate +
          passes.elementwise_backward * rows / elementwise_rate + passes.moved_backward * rows / row_move_rate;
      work.forward_compute += chunk.times.forward;
      work.backward_compute += chunk.times.backward_input + chunk.times.backward_weight;
      work.chunks.push_back(chunk);
    }
    // The samples' inputs, read on the step's path by the ranks that hold the first layer (one
    // core's rate, shared as the memory-bound kernels are).
    const bool reads_inputs = std::any_of(layout.layers.chunks.begin(), layout.layers.chunks.end(),
                                          [](const LayerRange& range) { return range.first == 0; });
    const double data_rate = in.cluster.sample_values_per_s(in.config.data.kind, in.data_held_in_memory) * memory_share;
    if (reads_inputs && data_rate > 0)
      work.data = in.config.data.micro_batches * rows * static_cast<double>(in.model.front().in_features) / data_rate;
    const double updated = static_cast<double>(work.prediction.optimizer.bytes) /
                           static_cast<double>(in.config.precision.types().optimizer_bytes());
    work.optimizer = updated / (in.cluster.optimizer_rate(in.config.precision.param_dtype) * memory_share);
  }

  // Seconds for `bytes` of `op` over the rank's group of `kind`, in `operations` operations
  // issued as `issue`, the transfer `slowest` times the mean rank's (an exchange ends with its
  // busiest rank's rows); the bus bytes are counted on the link class they cross.
  double collective(StageWork& work, GroupKind kind, CommOp op, double operations,
                    double slowest = 1.0) const {
    const std::int64_t bytes = work.prediction.comm(kind, op);
    const int ranks = kind == GroupKind::pipeline ? 2 : group_size(inputs_.shape, kind);
    if (bytes == 0 || ranks < 2) return 0;
    const LinkClass link = crosses_nodes(inputs_.shape, kind, work.rank, inputs_.ranks_per_node)
                               ? LinkClass::inter_node
                               : LinkClass::intra_node;
    const double bus = static_cast<double>(bytes) * bus_factor(op, ranks);
    (link == LinkClass::inter_node ? work.bus_bytes.inter_node : work.bus_bytes.intra_node) +=
        static_cast<std::int64_t>(bus);
    const LinkRates rates = host_staged(inputs_.config.device) ? inputs_.cluster.staged_link(link, op, ranks)
                                                               : inputs_.cluster.link(link, op);
    return operations * rates.latency_s + slowest * bus / rates.bus_bytes_per_s;
  }

  void communication_times(const RankLayout& layout, StageWork& work) const {
    const double micro_batches = inputs_.config.data.micro_batches;
    const double layers = std::max(1, layout.local_layer_count());
    const int zero = inputs_.config.strategies.get<ZeroOptions>().stage;
    const double per_pass = micro_batches * layers;
    // Waited for inside forward and backward, per micro-batch.
    const double blocking =
        collective(work, GroupKind::tensor, CommOp::all_reduce, 2 * per_pass) +
        collective(work, GroupKind::tensor, CommOp::reduce_scatter, 2 * per_pass) +
        collective(work, GroupKind::tensor, CommOp::all_gather, 3 * per_pass) +
        collective(work, GroupKind::expert, CommOp::all_to_all, 4 * per_pass,
                   inputs_.expert_imbalance) +
        collective(work, GroupKind::pipeline, CommOp::send,
                   2 * micro_batches * static_cast<double>(layout.layers.chunks.size()));
    // Counted on the link, timed as the send.
    collective(work, GroupKind::pipeline, CommOp::recv, 0);
    const double statistics =
        zero == 0 ? collective(work, GroupKind::data, CommOp::all_gather, per_pass) : 0;
    work.forward_comm = (blocking / 2 + statistics) / micro_batches;
    work.backward_comm = blocking / 2 / micro_batches;
    // Reductions the backward can hide all but a layer's share of: on a GPU, NCCL's kernels run
    // beside the computation, and so does host-staged MPI, whose rank's communication engine
    // stages and exchanges the started operations while the host launches the backward. Where
    // the ranks' cores do the communication themselves, nothing hides: MPI on CPUs whose ranks
    // fill the cores (the engine's thread then takes its turns from the computation's).
    const bool overlaps = inputs_.cluster.overlaps_communication;
    const auto hidden = [&](double seconds, double window) {
      if (!overlaps) return seconds;
      return seconds > 0 ? std::max(seconds - window * (layers - 1) / layers, seconds / layers) : 0.0;
    };
    double reductions = 0, reduce_scatters = 0, gathers = 0;
    // ZeRO shards over the data-parallel groups or, hybrid, over their shard groups, whose
    // shards are then summed across the replica groups once a step as each layer's last
    // micro-batch is reduced, behind the backward like data parallelism's buckets.
    for (GroupKind kind : {GroupKind::data, GroupKind::expert_data, GroupKind::data_shard,
                           GroupKind::expert_data_shard, GroupKind::data_replica, GroupKind::expert_data_replica}) {
      reductions += collective(work, kind, CommOp::all_reduce, layers);
      reduce_scatters += collective(work, kind, CommOp::reduce_scatter, zero == 1 ? layers : per_pass);
      if (zero > 0)
        gathers += collective(work, kind, CommOp::all_gather, zero == 3 ? 2 * per_pass : layers);
    }
    double after = hidden(reductions + (zero == 1 ? reduce_scatters : 0), work.backward_compute);
    if (zero >= 2) after += micro_batches * hidden(reduce_scatters / micro_batches, work.backward_compute);
    if (zero == 3) {
      after += micro_batches * hidden(gathers / micro_batches, work.forward_compute + work.backward_compute);
    } else {
      after += gathers;  // after the update, before the next step's forward
    }
    work.after_backward = after + collective(work, GroupKind::world, CommOp::all_reduce, 1);
  }

  const PlanInputs& inputs_;
  double share_;
};

}  // namespace

LayoutEstimate estimate_layout(const PlanInputs& inputs) {
  // Ranks beyond a node's devices share them, compute and memory alike.
  const int node_ranks = std::min(inputs.ranks_per_node, inputs.shape.world);
  const double share = std::min(1.0, static_cast<double>(inputs.cluster.devices_per_node) / node_ranks);
  const StageModel model(inputs, share);
  std::vector<StageWork> stages;
  std::vector<std::vector<Action>> lists;
  std::vector<std::vector<ComputeTimes>> times;
  for (int stage = 0; stage < inputs.shape.pp; ++stage) {
    stages.push_back(model.stage(stage));
    lists.push_back(stages.back().schedule);
    times.push_back(stages.back().chunk_times());
  }
  const PipelineOptions& pipeline = inputs.config.strategies.get<PipelineOptions>();
  const PipelineShape shape =
      schedule_shape(pipeline.schedule, inputs.shape.pp, pipeline.virtual_stages, inputs.config.data.micro_batches);
  const Timeline timeline = schedule_timeline(lists, shape, times);
  LayoutEstimate estimate{.memory_capacity = inputs.cluster.device_memory_bytes * share};
  estimate.memory_total = -1;
  const double micro_batches = inputs.config.data.micro_batches;
  for (std::size_t index = 0; index < stages.size(); ++index) {
    const StageWork& work = stages[index];
    if (work.memory_total > estimate.memory_total) {
      estimate.memory_rank = work.rank;
      estimate.prediction = work.prediction;
      estimate.memory_total = work.memory_total;
      estimate.bus_bytes = work.bus_bytes;
    }
    const StepTime step{
        .compute = micro_batches * (work.forward_compute + work.backward_compute) + work.optimizer,
        .forward = micro_batches * work.forward_compute,
        .backward = micro_batches * work.backward_compute,
        .optimizer = work.optimizer,
        .exposed_comm = micro_batches * (work.forward_comm + work.backward_comm) + work.after_backward,
        .bubble = timeline.makespan - timeline.busy[index],
        .data = work.data};
    if (step.total() > estimate.step.total()) estimate.step = step;
  }
  return estimate;
}

}  // namespace mlptrain
