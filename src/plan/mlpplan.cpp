// mlpplan: the placement calculator (DESIGN.md §2.8). For the trainer's own options and a world
// of --world N ranks on a cluster (a preset, a file, or this machine calibrated from its bench
// output), the memory by state of the rank that needs the most, its communication per step by
// operation and by link class, and the step time; for the layout given or, ranked, for every
// valid layout of the world. Pure arithmetic over the same functions the trainer's summary and
// --predict call: no MPI launch, nothing of the model allocated, so any world answers at once.
// The options are mlptrain's (one list, one validator: a layout mlptrain refuses, mlpplan
// refuses with the same line) plus mlpplan's own (plan/plan_request.hpp).
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "command_line/parser.hpp"
#include "plan/calibration.hpp"
#include "plan/layout_search.hpp"
#include "plan/listings.hpp"
#include "plan/plan_report.hpp"
#include "plan/plan_request.hpp"
#include "schedule/schedule_table.hpp"
#include "strategies/pipeline_parallel/pipeline_options.hpp"

namespace {

using namespace mlptrain;

PlannedLayout plan_layout(const Config& config, const std::vector<LayerSpec>& model, const DatasetInfo& data,
                          const PlanRequest& request, int ranks_per_node, const Cluster& cluster) {
  const GridShape shape = grid_shape(config, request.world);
  const Strategies strategies = wanted_strategies(config, shape);
  return {.config = config,
          .estimate = estimate_layout(
              {.strategies = strategies,
               .config = config,
               .model = model,
               .shape = shape,
               .loss_kind = data.kind == TargetKind::classification ? LossKind::cross_entropy : LossKind::mse,
               .ranks_per_node = ranks_per_node,
               .cluster = cluster,
               // As the trainer decides: the file's arrays under the cap are held in memory.
               .data_held_in_memory = held_in_memory(data, config.data.memory_bytes()),
               .expert_imbalance = request.expert_imbalance,
               .expert_peak_imbalance = request.expert_peak_imbalance.value_or(request.expert_imbalance)})};
}

void plan(int argc, char** argv) {
  const PlanRequest request = parse_plan_request(argc, argv);
  if (!request.list.empty()) {
    std::fputs(listing(request.list, request.json).c_str(), stdout);
    return;
  }
  ParsedOptions options = parse_options(request.trainer_arguments);
  if (options.help) {
    std::printf("usage: mlpplan --world N [mlpplan's options] [mlptrain's options]\n\n%s\n%s", plan_options_help,
                options.help_text.c_str());
    return;
  }
  Config& config = options.config;
  if (request.layouts == LayoutChoice::given) {
    validate_options(config, request.world);
  } else {
    // What is wrong whatever the layout (a learning rate, a batch the micro-batches do not
    // divide) is said with the trainer's line, as one process would hear it.
    Config alone = config;
    alone.grid = {.dp = 1};
    alone.strategies = {};  // every strategy's options at their defaults
    alone.device.offload = false;
    validate_options(alone, 1);
  }
  const Cluster cluster = request.calibration_files.empty()
                              ? load_cluster(request.cluster)
                              : calibrated_cluster(request.calibration_files, config.device, request.world);
  // A calibrated machine is one node holding the whole world unless told otherwise.
  const int ranks_per_node = request.ranks_per_node.value_or(
      request.calibration_files.empty() ? cluster.devices_per_node : request.world);
  // The data's widths and kind, as the trainer opens them (synthetic data is generated lazily).
  const DatasetInfo data = open_dataset({.kind = config.data.kind,
                                         .path = config.data.path,
                                         .input_dim = config.model.input_dim,
                                         .output_dim = config.model.output_dim})
                               ->info();
  const std::vector<LayerSpec> model = model_layer_specs(config.model.layers, data.input_dim, config.model.hidden,
                                                         data.output_dim, config.model.moe_every, config.model.experts,
                                                         config.model.top_k);
  std::vector<Config> layouts;
  if (request.layouts == LayoutChoice::all) {
    LayoutChoices choices{
        .micro_batches = request.micro_batch_choices.empty() ? std::vector<int>{config.data.micro_batches}
                                                             : request.micro_batch_choices,
        .virtual_stages = request.virtual_stage_choices};
    if (choices.virtual_stages.empty()) {
      choices.virtual_stages = {2, 4};
      const int given = config.strategies.get<PipelineOptions>().virtual_stages;
      if (given > 1 && std::ranges::count(choices.virtual_stages, given) == 0) choices.virtual_stages.push_back(given);
    }
    layouts = every_layout(config, request.world, ranks_per_node, choices);
    if (layouts.empty())
      throw UsageError(fmt::format("no layout of {} ranks is valid for this model and batch", request.world));
  } else {
    layouts.push_back(config);
  }
  std::vector<PlannedLayout> planned;
  planned.reserve(layouts.size());
  for (const Config& layout : layouts)
    planned.push_back(plan_layout(layout, model, data, request, ranks_per_node, cluster));
  // Those that fit, fastest first; then the rest, least over first.
  std::stable_sort(planned.begin(), planned.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.estimate.fits() != b.estimate.fits()) return a.estimate.fits();
    if (a.estimate.fits()) return a.estimate.step.total() < b.estimate.step.total();
    return a.estimate.memory_total < b.estimate.memory_total;
  });
  if (request.json) {
    for (const PlannedLayout& layout : planned)
      std::printf("%s\n", plan_json(layout, request.world, ranks_per_node).dump().c_str());
    return;
  }
  std::printf("%s",
              cluster_line(cluster, request.world, ranks_per_node, config.precision.types(), config.device).c_str());
  if (request.layouts == LayoutChoice::given) {
    std::printf("%s", layout_table(planned.front(), request.world).c_str());
  } else {
    const auto fitting = std::count_if(planned.begin(), planned.end(),
                                       [](const PlannedLayout& layout) { return layout.estimate.fits(); });
    std::printf("%zu valid layout(s) of %d ranks, %td fit:\n%s", planned.size(), request.world, fitting,
                ranking_table(planned, request.top).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    plan(argc, argv);
    return 0;
  } catch (const mlptrain::Error& error) {
    std::fprintf(stderr, "mlpplan: error: %s\n", error.what());
    return static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mlpplan: error: %s\n", error.what());
    return 1;
  }
}
