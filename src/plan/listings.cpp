// The programs' closed lists (see listings.hpp).
#include "plan/listings.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>

#include "core/error.hpp"
#include "command_line/parser.hpp"
#include "plan/cluster.hpp"
#include "schedule/schedule_table.hpp"
#include "strategies/registration.hpp"

namespace mlptrain {

namespace {

// Whether the schedule's order splits backward into B and W, on a shape it suits.
bool splits_backward(const ScheduleEntry& schedule) {
  const PipelineShape shape = schedule_shape(schedule, 2, 2, 4);
  const std::vector<Action> actions = schedule.order(shape, 0);
  return std::any_of(actions.begin(), actions.end(), [](const Action& action) {
    return action.kind == ActionKind::backward_input || action.kind == ActionKind::backward_weight;
  });
}

std::vector<nlohmann::json> schedules() {
  std::vector<nlohmann::json> rows;
  for (const ScheduleEntry& schedule : schedule_table())
    rows.push_back({{"name", schedule.name},
                    {"source", schedule.source},
                    {"chunked", schedule.chunked},
                    {"placement", schedule.placement == ChunkPlacement::v_shape ? "v_shape" : "looped"},
                    {"splits_backward", splits_backward(schedule)},
                    {"bubble_formula", schedule.bubble_formula}});
  return rows;
}

std::vector<nlohmann::json> strategies() {
  std::vector<nlohmann::json> rows;
  for (const StrategyRegistration& strategy : strategy_registry()) {
    nlohmann::json roles = nlohmann::json::array(), options = nlohmann::json::array();
    for (Role role : strategy.roles()) roles.push_back(role_name(role));
    for (const Option& option : strategy.options) options.push_back(option.name);
    rows.push_back({{"name", strategy.name}, {"roles", roles}, {"options", options}});
  }
  return rows;
}

template <typename Choice>
std::vector<nlohmann::json> choices() {
  std::vector<nlohmann::json> rows;
  for (const auto& [value, name] : ChoiceNames<Choice>::names) rows.push_back({{"name", name}});
  return rows;
}

std::vector<nlohmann::json> presets() {
  std::vector<nlohmann::json> rows;
  for (std::string_view name : cluster_preset_names()) rows.push_back({{"name", name}});
  return rows;
}

std::vector<nlohmann::json> options() {
  std::vector<nlohmann::json> rows;
  for (const OptionDescription& option : option_descriptions())
    rows.push_back({{"name", option.name}, {"section", option.section}, {"default", option.default_value},
                    {"help", option.help}});
  return rows;
}

const std::map<std::string, std::function<std::vector<nlohmann::json>()>>& lists() {
  static const std::map<std::string, std::function<std::vector<nlohmann::json>()>> known = {
      {"schedules", schedules}, {"strategies", strategies}, {"datasets", choices<DatasetKind>},
      {"devices", choices<Device>}, {"presets", presets}, {"options", options}};
  return known;
}

}  // namespace

std::vector<std::string> listing_names() {
  std::vector<std::string> names;
  for (const auto& [name, rows] : lists()) names.push_back(name);
  return names;
}

std::string listing(const std::string& what, bool json) {
  const auto found = lists().find(what);
  if (found == lists().end()) {
    std::string known;
    for (const std::string& name : listing_names()) known += (known.empty() ? "" : " | ") + name;
    throw UsageError(fmt::format("--list: unknown list '{}' (choose {})", what, known));
  }
  std::string text;
  for (const nlohmann::json& row : found->second())
    text += (json ? row.dump() : row["name"].get<std::string>()) + "\n";
  return text;
}

}  // namespace mlptrain
