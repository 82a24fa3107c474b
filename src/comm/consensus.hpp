// Agreement on failure across a group: a problem seen by any rank (an unreadable file, a bad
// checkpoint) becomes the same error on every rank, so no rank is left waiting in a collective.
#pragma once

#include <new>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace mlptrain {

// Returns the message of the lowest rank that reported one, on every rank.
std::optional<std::string> first_problem(Communicator& group,
                                         const std::optional<std::string>& local_problem);

// Runs `body` on every rank; if it throws an mlptrain Error on any rank, every rank throws that
// rank's error (the lowest such rank wins) as an AgreedError.
template <typename Body>
void agree_or_throw(Communicator& group, Body&& body) {
  std::optional<std::string> problem;
  ExitCode code = ExitCode::runtime_failure;
  try {
    body();
  } catch (const Error& error) {
    problem = error.what();
    code = error.code();
  } catch (const std::bad_alloc&) {
    problem = "out of memory (the model, batch or data do not fit this rank's memory)";
  }
  // The exit code travels as the message's first character.
  std::optional<std::string> tagged;
  if (problem) tagged = std::string(1, static_cast<char>('0' + static_cast<int>(code))) + *problem;
  if (auto agreed = first_problem(group, tagged)) {
    const auto agreed_code = static_cast<ExitCode>((*agreed)[0] - '0');
    throw AgreedError(agreed_code, agreed->substr(1));
  }
}

}  // namespace mlptrain
