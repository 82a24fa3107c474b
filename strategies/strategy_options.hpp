// What a strategy declares of the command line: its options (name, help, the Config field each
// sets, whose initial value is the default) and the rules it checks once the process grid is
// known. The option parser (layout/options.hpp) collects every registration's options into
// --help, parsing and INI files, and runs every registration's rules, wanted or not: an option of
// a strategy that does not take part is still checked against what it needs.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <variant>

#include "core/config.hpp"
#include "core/error.hpp"

namespace mlptrain {

using OptionField = std::variant<int Config::*, bool Config::*, double Config::*, std::string Config::*>;

struct StrategyOption {
  std::string_view name;  // as the command line (without --) and INI files spell it
  OptionField field;
  std::string_view help;
  // The choices, appended to the help ("name: a | b | c"); null when any value of the type goes.
  std::string (*choices)() = nullptr;
};

// The rules' vocabulary: a UsageError naming the option unless the condition holds.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw UsageError(message);
}

template <typename T>
void at_least(std::string_view name, T value, T minimum) {
  require(value >= minimum, fmt::format("--{} must be at least {} (got {})", name, minimum, value));
}

}  // namespace mlptrain
