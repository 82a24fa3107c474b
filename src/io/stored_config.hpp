// The configuration a checkpoint stores (its `config` attribute, INI text as --config reads it),
// set beside the configuration of the run that loads it: when the checkpoint does not fit the
// run, the message names the options that differ rather than only the tensor shapes.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mlptrain {

// `name = value` lines of INI text (comments and blank lines skipped).
std::map<std::string, std::string> ini_values(const std::string& text);

// "--hidden 64 (this run: 32), --layers 6 (this run: 4)": the options among `names` whose values
// differ between the stored and the current text; empty when none does.
std::string differing_options(const std::string& stored_ini, const std::string& current_ini,
                              const std::vector<std::string>& names);

}  // namespace mlptrain
