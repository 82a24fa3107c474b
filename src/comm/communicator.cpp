// Ledger accounting shared by every communicator backend (see communicator.hpp).
#include "comm/communicator.hpp"

#include <exception>
#include <numeric>

#include "core/timer.hpp"

namespace mlptrain {

std::int64_t Operation::ledger_bytes(int group_size) const {
  const auto element_bytes = static_cast<std::int64_t>(size_of(type));
  const auto elements = static_cast<std::int64_t>(count);
  switch (op) {
    case CommOp::all_reduce:
    case CommOp::reduce:
    case CommOp::broadcast:
    case CommOp::send:
    case CommOp::recv: return elements * element_bytes;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::gather:
    case CommOp::scatter: return elements * group_size * element_bytes;
    case CommOp::all_to_all:
      if (!send_counts.empty()) {
        const auto sent = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
        return static_cast<std::int64_t>(sent) * element_bytes;
      }
      return elements * group_size * element_bytes;
  }
  return 0;
}

double PendingOperation::completed_at_ms() const { return now_ms(); }

Request::Request(std::unique_ptr<PendingOperation> pending, CommLedger* ledger, std::string group,
                 CommOp op, std::int64_t bytes, DataType type, std::uint64_t sequence, double start_ms)
    : pending_(std::move(pending)), ledger_(ledger), group_(std::move(group)), op_(op),
      bytes_(bytes), type_(type), sequence_(sequence), start_ms_(start_ms) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (pending_) wait();
    pending_ = std::move(other.pending_);
    ledger_ = other.ledger_;
    group_ = std::move(other.group_);
    op_ = other.op_;
    bytes_ = other.bytes_;
    type_ = other.type_;
    sequence_ = other.sequence_;
    start_ms_ = other.start_ms_;
  }
  return *this;
}

Request::~Request() {
  // Waiting needs the other ranks: not while unwinding from an error they may not share.
  if (pending_ && std::uncaught_exceptions() == 0) wait();
}

bool Request::test() {
  if (!pending_) return true;
  if (!pending_->test()) return false;
  finish();
  return true;
}

void Request::wait() {
  if (!pending_) return;
  const double waited_from_ms = now_ms();
  pending_->wait();
  if (ledger_ != nullptr) ledger_->record_wait(now_ms() - waited_from_ms);
  finish();
}

void Request::finish() {
  const double end_ms = pending_->completed_at_ms();
  pending_.reset();
  if (ledger_ != nullptr) ledger_->record_completed(sequence_, op_, group_, bytes_, type_, start_ms_, end_ms);
}

void Communicator::run(const Operation& operation) {
  const double start_ms = now_ms();
  const std::int64_t bytes = operation.ledger_bytes(size());
  const std::uint64_t sequence = ledger_.record_posted(operation.op, group_, bytes, operation.type);
  run_backend(operation);
  const double end_ms = now_ms();
  ledger_.record_wait(end_ms - start_ms);
  ledger_.record_completed(sequence, operation.op, group_, bytes, operation.type, start_ms, end_ms);
}

Request Communicator::start(const Operation& operation) {
  const double start_ms = now_ms();
  const std::int64_t bytes = operation.ledger_bytes(size());
  const std::uint64_t sequence = ledger_.record_posted(operation.op, group_, bytes, operation.type);
  auto pending = start_backend(operation);
  return Request(std::move(pending), &ledger_, group_, operation.op, bytes, operation.type, sequence, start_ms);
}

}  // namespace mlptrain
