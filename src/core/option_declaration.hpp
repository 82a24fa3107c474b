// One option of the command line and INI files, declared once where its value lives: its name,
// the --help section it appears in, its help, and where its value is in a configuration (a field
// of a section of Config, or of a strategy's own block). The option parser (command_line/parser.hpp)
// reads these declarations: the run's from command_line/parser.cpp, each strategy's from its
// registration; nothing else names an option's field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "core/config.hpp"

namespace mlptrain {

enum class OptionSection { model, data, training, parallelism, precision, devices, output };

// How a closed set of choices is named and read: enums through ChoiceNames; other choice types
// (a table's entries) specialize this beside their type.
template <typename Choice>
struct ChoiceTraits {
  static std::string_view name(const Choice& choice) { return choice_name(choice); }
  static std::optional<Choice> parse(std::string_view text) { return parse_choice<Choice>(text); }
  static std::string list() { return choice_list<Choice>(); }
};

// A field holding one of a closed set, behind its traits.
struct ChoiceField {
  void* field = nullptr;
  std::string_view (*name)(const void* field) = nullptr;
  bool (*assign)(void* field, std::string_view text) = nullptr;  // false: no such choice
  std::string (*list)() = nullptr;                                 // "a | b | c"
};

using OptionField = std::variant<int*, std::int64_t*, double*, bool*, std::string*, ChoiceField>;

// A field of any option type as the parser takes it.
template <typename T>
OptionField option_field(T& field) {
  if constexpr (std::is_same_v<T, int> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> ||
                std::is_same_v<T, bool> || std::is_same_v<T, std::string>) {
    return &field;
  } else {
    return ChoiceField{
        .field = &field,
        .name = [](const void* value) { return ChoiceTraits<T>::name(*static_cast<const T*>(value)); },
        .assign = [](void* value, std::string_view text) {
          const std::optional<T> choice = ChoiceTraits<T>::parse(text);
          if (choice) *static_cast<T*>(value) = *choice;
          return choice.has_value();
        },
        .list = [] { return ChoiceTraits<T>::list(); }};
  }
}

struct Option {
  std::string_view name;  // as the command line (without --) and INI files spell it
  OptionSection section;
  OptionField (*field)(Config& config);
  std::string_view help;
  // The default as --help shows it, where the stored one stands for something else (0 for "derived
  // from the world", "unset" where another option decides): the value a run then uses, in words.
  std::string_view shown_default = {};
};

// Where an option of the run lives: `member` of the Config section `section`.
template <auto section, auto member>
OptionField config_field(Config& config) {
  return option_field(config.*section.*member);
}

// Where a strategy's option lives: `member` of its block of type Block.
template <typename Block, auto member>
OptionField block_field(Config& config) {
  return option_field(config.strategies.get<Block>().*member);
}

}  // namespace mlptrain
