// What a strategy declares of the command line: its options (core/option_declaration.hpp: name, help, and
// the field of the strategy's own block they set, whose initial value is the default) and the
// rules it checks once the process grid is known. The option parser (command_line/parser.hpp)
// collects every registration's options into --help, parsing and INI files, and runs every
// registration's rules, wanted or not: an option of a strategy that does not take part is still
// checked against what it needs.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/option_declaration.hpp"

namespace mlptrain {

// A strategy's option: `member` of its block Block, in the --help section of the parallelism.
template <typename Block, auto member>
constexpr Option strategy_option(std::string_view name, std::string_view help) {
  return {.name = name, .section = OptionSection::parallelism, .field = block_field<Block, member>, .help = help};
}

// The rules' vocabulary: a UsageError naming the option unless the condition holds.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw UsageError(message);
}

template <typename T>
void at_least(std::string_view name, T value, T minimum) {
  require(value >= minimum, fmt::format("--{} must be at least {} (got {})", name, minimum, value));
}

}  // namespace mlptrain
