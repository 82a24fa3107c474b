// Failure agreement (see consensus.hpp).
#include "comm/consensus.hpp"

#include <cstdint>

namespace mlptrain {

std::optional<std::string> first_problem(Communicator& group,
                                         const std::optional<std::string>& local_problem) {
  std::int64_t reporter = local_problem ? group.rank() : group.size();
  group.all_reduce(&reporter, 1, ReduceOp::min);
  if (reporter == group.size()) return std::nullopt;
  std::int64_t length = group.rank() == reporter ? static_cast<std::int64_t>(local_problem->size()) : 0;
  group.broadcast(&length, 1, static_cast<int>(reporter));
  std::string message(static_cast<std::size_t>(length), '\0');
  if (group.rank() == reporter) message = *local_problem;
  group.broadcast(message.data(), message.size(), static_cast<int>(reporter));
  return message;
}

}  // namespace mlptrain
