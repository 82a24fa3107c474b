// Building a rank's model (see rank_model.hpp).
#include "train/rank_model.hpp"

namespace mlptrain {

RankModel::RankModel(const Config& config, const ProcessGroups& groups, Kernels& kernels, Allocator& allocator,
                     std::vector<LayerSpec> model_specs, const Strategies& strategies, HostSide* offload,
                     const AllocationGuard& guard)
    : specs(std::move(model_specs)), layers(rank_layers(strategies, specs, groups.shape(), groups.place())) {
  const ParameterPlan plan = parameter_plan(strategies, config, groups.shape(), groups.place());
  guard([&] {
    parameters = std::make_unique<ParameterStore>(model_parameter_tensors(specs, layers.first, layers.last, plan),
                                                  allocator, plan, config.precision());
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
  initialize_state(placement, static_cast<std::uint64_t>(config.seed), allocator,
                   offload != nullptr ? *offload->memory : allocator);
  runner = std::make_unique<ModelRunner>(
      kernels, allocator, *parameters, specs, layers, *this->strategies,
      MoeSettings{.capacity_factor = config.capacity_factor, .aux_loss_coef = config.aux_loss_coef},
      config.recompute);
  // An offloaded update runs into the next forward, which waits for each layer's values.
  if (offload != nullptr) runner->set_forward_gate([this](int layer) { optimizer->wait_for_layer(layer); });
}

}  // namespace mlptrain
