// Parsing mlpplan's own options (see plan_request.hpp).
#include "plan/plan_request.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "core/error.hpp"

namespace mlptrain {

const char* const plan_options_help =
    "mlpplan's options (the rest are mlptrain's):\n"
    "  --world N                ranks to plan for (required)\n"
    "  --ranks-per-node G       consecutive ranks per node (default: the cluster's devices per node)\n"
    "  --cluster PRESET|FILE    h100-sxm-8 (default), a100-80gb-8, or a JSON file in their terms\n"
    "  --calibrate FILE...      this machine, from layerbench and commbench --json output\n"
    "  --layouts given|all      the layout of the options given (default), or every valid layout\n"
    "  --micro-batch-choices L  micro-batch counts --layouts all tries (default: --micro-batches)\n"
    "  --virtual-stage-choices L  model chunks per stage --layouts all tries with --schedule\n"
    "                           interleaved (each at least 2; default 2, 4 and --virtual-stages)\n"
    "  --top K                  rows --layouts all prints (default 10; 0: all)\n"
    "  --expert-imbalance F     an MoE layer's rows on the busiest of the ranks that split its experts,\n"
    "                           over the mean (default 1: balanced routing; a run's expert_load says)\n"
    "  --expert-peak-imbalance P  the same at the routing's most uneven step, which the busiest\n"
    "                           rank's activations follow (default: F)\n"
    "  --json                   one JSON object per layout (with --list: per entry)\n"
    "  --list WHAT              print a list the programs know, one name a line, and exit: schedules,\n"
    "                           strategies, datasets, devices, presets or options\n";

namespace {

// `value` read whole as a Number (stoi or stod), or nothing where it is not one.
template <typename Number>
std::optional<Number> whole_value(const std::string& value) {
  std::size_t used = 0;
  Number number{};
  try {
    if constexpr (std::is_same_v<Number, int>) number = std::stoi(value, &used);
    else number = std::stod(value, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != value.size()) return std::nullopt;
  return number;
}

int positive_number(const std::string& option, const std::string& value, int least) {
  const std::optional<int> number = whole_value<int>(value);
  if (!number || *number < least)
    throw UsageError(fmt::format("{} '{}' is not a whole number of at least {}", option, value, least));
  return *number;
}

std::vector<int> number_list(const std::string& option, const std::string& text, int least) {
  std::vector<int> numbers;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    numbers.push_back(positive_number(option, text.substr(start, end - start), least));
    start = end + 1;
  }
  // A value given twice is one choice, not two layouts alike.
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  return numbers;
}

double factor_of_at_least_one(const std::string& option, const std::string& value) {
  const std::optional<double> number = whole_value<double>(value);
  if (!number || !(*number >= 1.0) || !std::isfinite(*number))
    throw UsageError(fmt::format("{} '{}' is not a number of at least 1", option, value));
  return *number;
}

}  // namespace

PlanRequest parse_plan_request(int argc, char** argv) {
  PlanRequest request;
  for (int index = 1; index < argc; ++index) {
    std::string argument = argv[index], value;
    const std::size_t equals = argument.find('=');
    const bool inline_value = argument.rfind("--", 0) == 0 && equals != std::string::npos;
    if (inline_value) {
      value = argument.substr(equals + 1);
      argument = argument.substr(0, equals);
    }
    const auto next = [&]() -> std::string {
      if (inline_value) return value;
      if (index + 1 >= argc) throw UsageError(fmt::format("{} needs a value", argument));
      return argv[++index];
    };
    if (argument == "--json") {
      request.json = true;
    } else if (argument == "--list") {
      request.list = next();
    } else if (argument == "--world") {
      request.world = positive_number(argument, next(), 1);
    } else if (argument == "--ranks-per-node") {
      request.ranks_per_node = positive_number(argument, next(), 1);
    } else if (argument == "--cluster") {
      request.cluster = next();
      request.cluster_given = true;
    } else if (argument == "--calibrate") {
      if (inline_value) request.calibration_files.push_back(value);
      while (index + 1 < argc && std::string(argv[index + 1]).rfind("--", 0) != 0)
        request.calibration_files.push_back(argv[++index]);
      if (request.calibration_files.empty()) throw UsageError("--calibrate needs layerbench and commbench output files");
    } else if (argument == "--layouts") {
      const std::string choice = next();
      if (choice != "given" && choice != "all")
        throw UsageError(fmt::format("--layouts '{}' is not one of: given | all", choice));
      request.layouts = choice == "all" ? LayoutChoice::all : LayoutChoice::given;
    } else if (argument == "--top") {
      request.top = positive_number(argument, next(), 0);
    } else if (argument == "--expert-imbalance") {
      request.expert_imbalance = factor_of_at_least_one(argument, next());
    } else if (argument == "--expert-peak-imbalance") {
      request.expert_peak_imbalance = factor_of_at_least_one(argument, next());
    } else if (argument == "--micro-batch-choices") {
      request.micro_batch_choices = number_list(argument, next(), 1);
    } else if (argument == "--virtual-stage-choices") {
      request.virtual_stage_choices = number_list(argument, next(), 2);
    } else {
      if (argument == "--help") request.help = true;
      request.trainer_arguments.push_back(argv[index]);
    }
  }
  if (request.cluster_given && !request.calibration_files.empty())
    throw UsageError("--cluster and --calibrate both describe the cluster: give one");
  if (request.world == 0 && !request.help && request.list.empty())
    throw UsageError("--world N is required: the number of ranks to plan for");
  return request;
}

}  // namespace mlptrain
