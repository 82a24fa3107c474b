// mlpplan's own options, split from the trainer's (which mlpplan parses and validates with the
// trainer's own functions): the world, the cluster, which layouts to answer for and how.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mlptrain {

enum class LayoutChoice { given, all };

struct PlanRequest {
  std::vector<std::string> trainer_arguments;
  int world = 0;
  std::optional<int> ranks_per_node;      // default: the cluster's devices per node
  std::string cluster = "h100-sxm-8";     // a preset or a JSON file
  bool cluster_given = false;
  std::vector<std::string> calibration_files;  // --calibrate: this machine, from bench output
  LayoutChoice layouts = LayoutChoice::given;
  int top = 10;                                // rows printed with --layouts all
  double expert_imbalance = 1.0;               // busiest expert rank's MoE rows over the mean
  // The same at the routing's most uneven step, which its activations follow; default: the mean's.
  std::optional<double> expert_peak_imbalance;
  std::vector<int> micro_batch_choices;        // --layouts all; default: the trainer's value
  std::vector<int> virtual_stage_choices;      // --layouts all; default: 2, 4 and the trainer's value
  bool json = false;
  bool help = false;
  std::string list;  // --list WHAT: print a list the programs know, and nothing else
};

// Throws UsageError naming the option.
PlanRequest parse_plan_request(int argc, char** argv);

// mlpplan's options, for --help.
extern const char* const plan_options_help;

}  // namespace mlptrain
