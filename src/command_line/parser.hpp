// The command line and INI files of `mlptrain` (DESIGN.md §2.3), through Boost.ProgramOptions.
// One list of options drives parsing, --help and the INI text stored in checkpoints, so they
// cannot drift apart.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/option_declaration.hpp"
#include "core/process_grid.hpp"

namespace mlptrain {

struct ParsedOptions {
  Config config;
  bool help = false;
  std::string help_text;
};

// Parses argv and, with --config FILE, the INI file (command-line values win). Throws UsageError.
ParsedOptions parse_options(const std::vector<std::string>& arguments);

// The run's own options (run_option_list.cpp); each strategy declares its own in its registration.
std::span<const Option> run_options();

// Checks every value and combination for a world of `world_size` ranks and fills derived values
// (dp; fp16's loss-scaling defaults) (validation.cpp). Throws UsageError naming the offending
// option. Pure: every rank decides alike.
void validate_options(Config& config, int world_size);

// The process grid of a validated configuration on `world_size` ranks.
GridShape grid_shape(const Config& config, int world_size);

// The configuration as INI text that --config reads back.
std::string to_ini(const Config& config);

// The options that decide the model's tensor shapes (named as on the command line).
std::vector<std::string> model_shape_options();

// Every option as --help shows it: its name, section, default (as INI text) and help.
struct OptionDescription {
  std::string name;
  std::string section;
  std::string default_value;
  std::string help;
};
std::vector<OptionDescription> option_descriptions();

}  // namespace mlptrain
