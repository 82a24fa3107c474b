// mlpplan: the placement calculator (DESIGN.md §2.8), first part: for the trainer's own options
// and a world of --world N ranks, the memory by state of the rank that needs the most and its
// communication per step, from the same pure functions the trainer's summary and --predict call
// (train/rank_plan.hpp). Pure arithmetic: no MPI launch, nothing of the model allocated, so any
// world size answers at once. The options are mlptrain's (one list, one validator: a layout
// mlptrain refuses, mlpplan refuses with the same line) plus --world and --json. Ranks that
// differ only in their data-parallel coordinate hold the same (sharded) amounts, so one replica's
// ranks, tp x pp of them, stand for the world.
#include <algorithm>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "data/dataset.hpp"
#include "train/options.hpp"
#include "train/rank_plan.hpp"

namespace {

using namespace mlptrain;

struct PlanRequest {
  std::vector<std::string> trainer_arguments;
  int world = 0;
  bool json = false;
};

// mlpplan's own options out of the list; the rest are the trainer's.
PlanRequest split_arguments(int argc, char** argv) {
  PlanRequest request;
  for (int index = 1; index < argc; ++index) {
    const std::string argument = argv[index];
    if (argument == "--json") {
      request.json = true;
    } else if (argument == "--world" || argument.rfind("--world=", 0) == 0) {
      std::string value = argument == "--world" ? (index + 1 < argc ? argv[++index] : "") : argument.substr(8);
      std::size_t used = 0;
      try {
        request.world = std::stoi(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != value.size() || request.world < 1)
        throw UsageError(fmt::format("--world '{}' is not a number of ranks of at least 1", value));
    } else {
      request.trainer_arguments.push_back(argument);
    }
  }
  const bool help = std::find(request.trainer_arguments.begin(), request.trainer_arguments.end(), "--help") !=
                    request.trainer_arguments.end();
  if (request.world == 0 && !help) throw UsageError("--world N is required: the number of ranks to plan for");
  return request;
}

struct RankPlan {
  int rank = 0;
  Prediction prediction;
  std::int64_t total = 0;  // bytes over the placed states
};

nlohmann::json plan_json(const Config& config, int world, const RankPlan& plan) {
  nlohmann::json memory = nlohmann::json::object(), modes = nlohmann::json::object();
  for (MemoryState state : placed_states) {
    memory[std::string(memory_state_name(state))] = plan.prediction.state(state).bytes;
    modes[std::string(memory_state_name(state))] = mode_code(plan.prediction.state(state).mode);
  }
  memory["total"] = plan.total;
  nlohmann::json comm = nlohmann::json::object();
  for (CommOp op : training_comm_ops) comm[std::string(comm_op_name(op))] = plan.prediction.comm(op);
  const nlohmann::json layout = {{"dp", config.dp},
                                 {"tp", config.tp},
                                 {"pp", config.pp},
                                 {"ep", config.ep},
                                 {"zero", config.zero},
                                 {"schedule", config.pp > 1 ? std::string(choice_name(config.schedule)) : "none"},
                                 {"micro_batches", config.micro_batches},
                                 {"recompute", config.recompute},
                                 {"offload", config.offload}};
  return {{"layout", layout},       {"world", world},           {"memory_bytes", memory}, {"memory_rank", plan.rank},
          {"modes", modes},         {"comm_bytes_per_step", comm}, {"param_dtype", data_type_name(config.precision().param)},
          {"reduce_dtype", data_type_name(config.precision().reduce)}};
}

void print_table(const Config& config, int world, const RankPlan& plan) {
  std::printf("mlpplan: %d rank(s): dp %d x tp %d x pp %d (ep %d), ZeRO stage %d; rank %d needs the most\n", world,
              config.dp, config.tp, config.pp, config.ep, config.zero, plan.rank);
  std::printf("  %-12s %-4s %16s %12s %12s\n", "state", "mode", "bytes", "GB (1e9)", "GiB");
  const auto row = [](const std::string& name, std::string_view mode, std::int64_t bytes) {
    std::printf("  %-12s %-4s %16lld %12.3f %12.3f\n", name.c_str(), std::string(mode).c_str(),
                static_cast<long long>(bytes), static_cast<double>(bytes) / 1e9,
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  };
  for (MemoryState state : placed_states)
    row(std::string(memory_state_name(state)), mode_code(plan.prediction.state(state).mode),
        plan.prediction.state(state).bytes);
  row("total", "", plan.total);
  std::printf("  communication per step (nccl-tests' sizes):\n");
  for (CommOp op : training_comm_ops)
    if (plan.prediction.comm(op) > 0)
      std::printf("  %-14s %16lld bytes\n", std::string(comm_op_name(op)).c_str(),
                  static_cast<long long>(plan.prediction.comm(op)));
}

void plan(int argc, char** argv) {
  const PlanRequest request = split_arguments(argc, argv);
  ParsedOptions options = parse_options(request.trainer_arguments);
  if (options.help) {
    std::printf("usage: mlpplan --world N [--json] [mlptrain's options]\n\n%s", options.help_text.c_str());
    return;
  }
  Config& config = options.config;
  validate_options(config, request.world);
  // The data's widths and kind, as the trainer opens them (synthetic data is generated lazily).
  const DatasetInfo data = open_dataset({.kind = config.dataset,
                                         .path = config.data_path,
                                         .input_dim = config.input_dim,
                                         .output_dim = config.output_dim})
                               ->info();
  const LossKind loss_kind = data.kind == TargetKind::classification ? LossKind::cross_entropy : LossKind::mse;
  const std::vector<LayerSpec> model = model_layer_specs(config.layers, data.input_dim, config.hidden,
                                                         data.output_dim, config.moe_every, config.experts,
                                                         config.top_k);
  const GridShape shape{.world = request.world, .tp = config.tp, .dp = config.dp, .pp = config.pp, .ep = config.ep};
  const Strategies strategies = wanted_strategies(config, shape);
  RankPlan largest;
  largest.total = -1;
  for (int stage = 0; stage < shape.pp; ++stage)
    for (int tensor = 0; tensor < shape.tp; ++tensor) {
      const int rank = rank_of(shape, tensor, 0, stage);
      const RankLayout layout = rank_layout(strategies, config, model, shape, coordinates_of(shape, rank), loss_kind);
      RankPlan candidate{.rank = rank, .prediction = predict_rank(strategies, layout)};
      for (MemoryState state : placed_states) candidate.total += candidate.prediction.state(state).bytes;
      if (candidate.total > largest.total) largest = candidate;
    }
  if (request.json) {
    std::printf("%s\n", plan_json(config, request.world, largest).dump().c_str());
  } else {
    print_table(config, request.world, largest);
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
