// Option parsing and validation (see parser.hpp).
#include "command_line/parser.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <variant>

#include "core/error.hpp"
#include "core/option_declaration.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

namespace po = boost::program_options;

namespace {

using S = OptionSection;

// Every option: the run's, then each strategy's (in the parallelism section).
std::vector<Option> all_options() {
  const std::span<const Option> run = run_options();
  std::vector<Option> options(run.begin(), run.end());
  for (const StrategyRegistration& strategy : strategy_registry())
    options.insert(options.end(), strategy.options.begin(), strategy.options.end());
  return options;
}

const char* section_title(OptionSection section) {
  switch (section) {
    case S::model: return "Model";
    case S::data: return "Data";
    case S::training: return "Training";
    case S::parallelism: return "Parallelism";
    case S::precision: return "Precision";
    case S::devices: return "Devices";
    case S::output: return "Output";
  }
  return "";
}

// A value as INI files and --help write it.
std::string ini_value(const OptionField& field) {
  return std::visit(
      [](const auto& value) -> std::string {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ChoiceField>) {
          return std::string(value.name(value.field));
        } else if constexpr (std::is_same_v<T, bool*>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double*>) {
          return fmt::format("{}", *value);  // shortest text that reads back exactly
        } else if constexpr (std::is_same_v<T, std::string*>) {
          return *value;
        } else {
          return std::to_string(*value);
        }
      },
      field);
}

// An option's default as --help and the option list show it: its own words where the stored
// value stands for something else, else the value itself.
std::string shown_default(const Option& option, const OptionField& field) {
  return option.shown_default.empty() ? ini_value(field) : std::string(option.shown_default);
}

struct Descriptions {
  std::vector<po::options_description> sections;
  po::options_description all{"Options"};
  po::options_description in_files;  // what an INI file may set: not --help or --config
  std::vector<std::string> helps;     // kept alive: Boost keeps pointers to them

  explicit Descriptions(Config& config) {
    po::options_description general("General");
    general.add_options()("help,h", "show this help")("config", po::value<std::string>(),
                                                      "INI file of options (command line wins)");
    all.add(general);
    for (int index = 0; index <= static_cast<int>(S::output); ++index)
      sections.emplace_back(section_title(static_cast<S>(index)));
    const std::vector<Option> options = all_options();
    helps.reserve(options.size());
    for (const Option& option : options) {
      const OptionField field = option.field(config);
      const char* name = option.name.data();
      auto& description = sections[static_cast<int>(option.section)];
      std::visit(
          [&](auto value) {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, ChoiceField>) {
              // A closed set is read as its name and checked at once, naming the choices.
              const char* help = helps.emplace_back(fmt::format("{}: {}", option.help, value.list())).c_str();
              description.add_options()(
                  name,
                  po::value<std::string>()->default_value(ini_value(value))->notifier([value, name](const std::string& text) {
                    if (!value.assign(value.field, text))
                      throw UsageError(fmt::format("--{}: unknown value '{}' (choose {})", name, text, value.list()));
                  }),
                  help);
            } else if constexpr (std::is_same_v<T, bool*>) {
              // `--flag` alone means true; `--flag=false` switches off what an INI file switched on.
              description.add_options()(name, po::value<bool>(value)->default_value(*value)->implicit_value(true),
                                        option.help.data());
            } else {
              description.add_options()(name, po::value(value)->default_value(*value, shown_default(option, value)),
                                        option.help.data());
            }
          },
          field);
    }
    for (auto& section : sections) {
      all.add(section);
      in_files.add(section);
    }
  }
};

}  // namespace

ParsedOptions parse_options(const std::vector<std::string>& arguments) {
  ParsedOptions parsed;
  Descriptions descriptions(parsed.config);
  po::variables_map values;
  try {
    po::store(po::command_line_parser(arguments).options(descriptions.all).run(), values);
  } catch (const po::error& error) {
    throw UsageError(std::string(error.what()) + " (see --help)");
  }
  if (values.count("help")) {
    std::ostringstream text;
    text << "usage: mpiexec -n N mlptrain [options]\n\n" << descriptions.all;
    parsed.help = true;
    parsed.help_text = text.str();
    return parsed;
  }
  if (values.count("config")) {
    const std::string path = values["config"].as<std::string>();
    std::ifstream file(path);
    if (!file) throw UsageError("--config: cannot open '" + path + "'");
    try {
      po::store(po::parse_config_file(file, descriptions.in_files), values);
    } catch (const po::error& error) {
      throw UsageError("--config '" + path + "': " + error.what());
    }
  }
  try {
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(std::string(error.what()) + " (see --help)");
  }
  return parsed;
}

GridShape grid_shape(const Config& config, int world_size) {
  GridShape shape{.world = world_size, .tp = config.grid.tp, .dp = config.grid.dp, .pp = config.grid.pp, .ep = config.grid.ep};
  for (const StrategyRegistration& strategy : strategy_registry())
    if (strategy.shape != nullptr) strategy.shape(config, shape);
  return shape;
}

std::string to_ini(const Config& config) {
  std::string text = "# mlptrain configuration\n";
  Config read = config;  // the fields are read through mutable views
  for (const Option& option : all_options())
    text += fmt::format("{} = {}\n", option.name, ini_value(option.field(read)));
  return text;
}

std::vector<OptionDescription> option_descriptions() {
  std::vector<OptionDescription> descriptions;
  Config defaults;
  for (const Option& option : all_options())
    descriptions.push_back({.name = std::string(option.name),
                            .section = section_title(option.section),
                            .default_value = shown_default(option, option.field(defaults)),
                            .help = std::string(option.help)});
  return descriptions;
}

std::vector<std::string> model_shape_options() {
  return {"layers", "hidden", "input-dim", "output-dim", "moe-every", "experts"};
}

}  // namespace mlptrain
