// Comparing a stored configuration with the current one (see stored_config.hpp).
#include "io/stored_config.hpp"

#include <sstream>

namespace mlptrain {

namespace {

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace

std::map<std::string, std::string> ini_values(const std::string& text) {
  std::map<std::string, std::string> values;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto equals = line.find('=');
    if (line.empty() || line[0] == '#' || equals == std::string::npos) continue;
    values[trimmed(line.substr(0, equals))] = trimmed(line.substr(equals + 1));
  }
  return values;
}

std::string differing_options(const std::string& stored_ini, const std::string& current_ini,
                              const std::vector<std::string>& names) {
  const auto stored = ini_values(stored_ini), current = ini_values(current_ini);
  std::string text;
  for (const std::string& name : names) {
    const auto was = stored.find(name), is = current.find(name);
    const std::string old_value = was != stored.end() ? was->second : "(not stored)";
    const std::string new_value = is != current.end() ? is->second : "(unset)";
    if (old_value == new_value) continue;
    text += (text.empty() ? "" : ", ") + ("--" + name + " " + old_value + " (this run: " + new_value + ")");
  }
  return text;
}

}  // namespace mlptrain
