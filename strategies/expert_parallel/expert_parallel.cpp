// Expert parallelism for MoE layers (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et
// al. 2021). The experts of each MoE layer are split over an expert-parallel group of X ranks
// carved out of the data-parallel group (E / X experts each); dense layers and routers stay
// replicated. An MoE layer (src/model/moe.cpp) routes its tokens, then through this strategy:
//   - gathers every data-parallel rank's per-expert assignment counts and probability sums, so
//     capacity, dropping and the auxiliary loss are those of the global micro-batch (and each
//     rank knows how many rows it will send to and receive from every peer: no second count
//     exchange is needed);
//   - sends each kept assignment's row to the rank of its expert with a variable all-to-all on the
//     EP group, and the experts' outputs back with a second one; backward sends the output
//     gradients out and the input gradients back the same ways, counts swapped. Rows travel in
//     the param type.
// Gradients of an expert are summed only over the ranks holding the same experts (the
// expert_data group, dp / X ranks), which the data-parallel strategy does by each tensor's
// replica group. With X = 1 and dp > 1 the strategy still takes part: the micro-batch is global.
// With tensor parallelism (T ranks holding the same tokens) each EP rank's experts are split
// further into T equal slices, one per tensor rank: every tensor rank routes alike and sends only
// its slice's assignments, so each MoE layer's output is a partial sum over the slices that the
// tensor-parallel strategy all-reduces once, as it does a row-parallel layer's (and its input
// gradient in backward, as a column-parallel layer's); the router's probability gradients are
// summed over the tensor group here, inside the layer's backward.
#include <algorithm>

#include <fmt/format.h>

#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

class ExpertParallel final : public Strategy, public ExpertExchange, public SplitsTensors {
 public:
  explicit ExpertParallel(const StrategyContext& context)
      : data_(context.groups.group(GroupKind::data)),
        expert_(context.groups.group(GroupKind::expert)),
        tensor_(context.groups.group(GroupKind::tensor)) {}

  int data_ranks() const override { return data_.size(); }
  int data_rank() const override { return data_.rank(); }
  int expert_ranks() const override { return expert_.size(); }
  int expert_rank() const override { return expert_.rank(); }

  int tensor_ranks() const override { return tensor_.size(); }
  int tensor_rank() const override { return tensor_.rank(); }

  void gather_statistics(const double* local, double* all, std::size_t count) override {
    if (data_.size() == 1) {
      std::copy_n(local, count, all);
      return;
    }
    data_.all_gather(local, all, count);
  }

  void sum_over_tensor_group(float* data, std::size_t count) override {
    tensor_.all_reduce(data, count, DataType::float32);
  }

  void exchange_rows(const void* send, const std::vector<std::size_t>& send_elements, void* receive,
                     const std::vector<std::size_t>& receive_elements, DataType type) override {
    expert_.all_to_all_variable(send, send_elements, receive, receive_elements, type);
  }

 private:
  Communicator& data_;
  Communicator& expert_;
  Communicator& tensor_;
};

// The experts split evenly over an expert-parallel group carved out of the data-parallel one.
void validate(const Config& c) {
  require(c.grid.dp % c.grid.ep == 0, fmt::format("--ep {} does not divide dp {}", c.grid.ep, c.grid.dp));
  require(c.grid.ep == 1 || c.model.moe_every > 0, "--ep splits the experts of MoE layers: it needs --moe-every");
  require(c.model.moe_every == 0 || c.model.experts % c.grid.ep == 0,
          fmt::format("--experts {} is not divisible by --ep {}", c.model.experts, c.grid.ep));
}

bool wanted(const Config& config, const GridShape& shape) {
  return config.model.moe_every > 0 && (shape.dp > 1 || shape.tp > 1);
}

// Experts split on their first dimension over the EP group: rank j holds [j E/X, (j+1) E/X).
void plan(const Config&, const GridShape& shape, const GridCoordinates& place, ParameterPlan& plan) {
  if (shape.ep == 1) return;
  plan.splits.push_back([rank = place.ep, size = shape.ep](ParameterTensor& tensor) {
    if (!tensor.expert) return;
    tensor.local_start[0] += tensor.local_shape[0] * rank / size;
    tensor.local_shape[0] /= size;
  });
}


int local_moe_layers(const RankLayout& layout) {
  int count = 0;
  for (int layer : layout.layers.list())
    count += layout.model[static_cast<std::size_t>(layer)].moe() ? 1 : 0;
  return count;
}

void predict(const RankLayout& layout, Prediction& prediction) {
  // Per MoE layer and micro-batch: one gather of 2E + 1 statistics per rank; with the experts
  // split, four exchanges of about k rows per token when routing is balanced (the summary
  // replaces this by what the routing counts give).
  const Config& config = layout.config;
  const std::int64_t passes = static_cast<std::int64_t>(local_moe_layers(layout)) * config.data.micro_batches;
  if (layout.shape.dp > 1)
    prediction.add_comm(GroupKind::data, CommOp::all_gather, passes * (2 * config.model.experts + 1) * 8 * layout.shape.dp);
  if (layout.shape.ep > 1)
    prediction.add_comm(GroupKind::expert, CommOp::all_to_all,
                        passes * 4 * config.model.top_k * layout.rows * config.model.hidden *
                            static_cast<std::int64_t>(size_of(config.precision.param_dtype)) / layout.shape.tp);
}

std::string describe(const RankLayout& layout) {
  const int experts = layout.config.model.experts, ranks = layout.shape.ep;
  return fmt::format("experts: routing over the global micro-batch of {} data-parallel ranks; {} of the {} "
                     "experts of each MoE layer on each of the {} rank(s) of an expert-parallel group, "
                     "expert gradients summed over {} rank(s)",
                     layout.shape.dp, experts / ranks, experts, ranks, layout.shape.dp / ranks);
}


}  // namespace

extern const StrategyRegistration expert_parallel_registration = register_strategy<ExpertParallel>({
    .name = "expert_parallel",
    .validate = validate,
    .wanted = wanted,
    .plan = plan,
    .predict = predict,
    .describe = describe});

}  // namespace mlptrain
