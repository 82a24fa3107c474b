// The closed lists the programs know (pipeline schedules, strategies, datasets, devices, cluster
// presets, options), printed by `mlpplan --list WHAT` for scripts, tests and docs to read rather
// than copy: a name is said once, in the code that defines it.
#pragma once

#include <string>
#include <vector>

namespace mlptrain {

// The lists `--list` knows.
std::vector<std::string> listing_names();

// One line per entry: its name, or with `json` one JSON object with what the program knows of it
// (a schedule's source, chunks, placement, whether its backward splits into B and W, and its
// bubble's formula; a strategy's roles and options; an option's section and default). Throws
// UsageError for a list it does not know.
std::string listing(const std::string& what, bool json);

}  // namespace mlptrain
