// Errors are values users can read. A UsageError is a bad flag, INI file or input (exit code 2);
// a RuntimeFailure is a failure while running (exit code 1). Both carry one line of text that
// names the offending option or file, printed once by rank 0.
#pragma once

#include <stdexcept>
#include <string>

namespace mlptrain {

// `stopped`: a stop signal ended the run at a step boundary, its state saved (a requeued rerun
// with --resume auto continues it).
enum class ExitCode : int { success = 0, runtime_failure = 1, usage = 2, stopped = 3 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ExitCode::usage, message) {}
};

class RuntimeFailure : public Error {
 public:
  explicit RuntimeFailure(const std::string& message) : Error(ExitCode::runtime_failure, message) {}
};

// An error every rank of the world has agreed on (see comm/consensus.hpp): each rank holds the
// same one, so rank 0 alone reports it and every rank exits cleanly with its code.
class AgreedError : public Error {
 public:
  using Error::Error;
};

}  // namespace mlptrain
