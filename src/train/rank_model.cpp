// Building a rank's model (see rank_model.hpp).
#include "train/rank_model.hpp"

namespace mlptrain {

RankModel::RankModel(const Config& config, const ProcessGroups& groups, Kernels& kernels, Allocator& allocator,
                     std::vector<LayerSpec> model_specs, const Strategies& strategies, HostSide* offload,
                     const AllocationGuard& guard)
    : specs(std::move(model_specs)),
      taking_part(strategies),
      layers(rank_layers(strategies, config, specs, groups.shape(), groups.place())) {
  for (const LayerSpec& spec : specs)
    if (spec.moe()) moe_layers.push_back(spec.index);
  const ParameterPlan plan = parameter_plan(strategies, config, groups.shape(), groups.place());
  guard([&] {
    parameters = std::make_unique<ParameterStore>(model_parameter_tensors(specs, layers.list(), plan),
                                                  allocator, plan, config.precision.types());
  });
  const StrategyContext context{.config = config,
                                .groups = groups,
                                .kernels = kernels,
                                .allocator = allocator,
                                .parameters = *parameters,
                                .layers = specs,
                                .local = layers};
  guard([&] { this->strategies = std::make_unique<StrategyStack>(context, strategies); });
  std::optional<StatePlacement> sharded = this->strategies->state_placement();
  values_read_after_step = sharded.has_value();
  placement = sharded ? std::move(*sharded) : store_placement(*parameters, groups.shape(), groups.place());
  // The optimizer places the masters (a 16-bit param type keeps them apart from the values).
  guard([&] { optimizer = std::make_unique<AdamW>(config, allocator, placement, offload); });
  initialize_state(placement, static_cast<std::uint64_t>(config.training.seed), allocator,
                   offload != nullptr ? *offload->memory : allocator);
  for (const LayerRange& chunk : layers.chunks) {
    runners.push_back(std::make_unique<ChunkRunner>(
        kernels, allocator, *parameters, specs, chunk, *this->strategies,
        MoeSettings{.capacity_factor = config.model.capacity_factor, .aux_loss_coef = config.model.aux_loss_coef},
        config.training.recompute));
    // An offloaded update runs into the next forward, which waits for each layer's values.
    if (offload != nullptr) runners.back()->set_forward_gate([this](int layer) { optimizer->wait_for_layer(layer); });
  }
}

std::vector<ChunkRunner*> RankModel::chunk_runners() const {
  std::vector<ChunkRunner*> chunks;
  for (const auto& runner : runners) chunks.push_back(runner.get());
  return chunks;
}

MoeStatistics RankModel::take_moe_statistics() {
  MoeStatistics total;
  for (const auto& runner : runners) total.add(runner->take_moe_statistics());
  return total;
}

std::vector<std::int64_t> RankModel::largest_moe_bytes() const {
  std::vector<std::int64_t> largest;
  for (const auto& runner : runners) largest.push_back(runner->largest_moe_bytes());
  return largest;
}

}  // namespace mlptrain
