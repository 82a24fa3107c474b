// One process's exchange (see expert_exchange.hpp): it holds the whole micro-batch and every expert.
#include "model/expert_exchange.hpp"

#include <algorithm>
#include <cstring>

namespace mlptrain {

void SingleProcessExchange::gather_statistics(const double* local, double* all, std::size_t count) {
  std::copy_n(local, count, all);
}

void SingleProcessExchange::exchange_rows(const void* send, const std::vector<std::size_t>& send_elements,
                                          void* receive, const std::vector<std::size_t>&, DataType type) {
  std::memcpy(receive, send, send_elements.at(0) * size_of(type));
}

}  // namespace mlptrain
