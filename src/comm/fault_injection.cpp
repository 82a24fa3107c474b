// Leaving out one operation on purpose (see fault_injection.hpp).
#include "comm/fault_injection.hpp"

#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/error.hpp"

namespace mlptrain {

namespace {

// A request of the inner communicator, as the outer one's pending operation.
class ForwardedOperation final : public PendingOperation {
 public:
  explicit ForwardedOperation(Request request) : request_(std::move(request)) {}
  bool test() override { return request_.test(); }
  void wait() override { request_.wait(); }

 private:
  Request request_;
};

// Operations reach the run's ledger through the inner communicator; this one's base records
// them in a ledger of its own, which nothing reads (so nothing is counted twice).
struct UnreadLedger {
  CommLedger unread_ledger;
};

class SkippingCommunicator final : private UnreadLedger, public Communicator {
 public:
  SkippingCommunicator(std::unique_ptr<Communicator> inner, const FaultPlan& plan)
      : Communicator(inner->group(), unread_ledger), inner_(std::move(inner)), plan_(plan) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void barrier() override { inner_->barrier(); }
  Buffer allocate_collective_memory(Allocator& fallback, MemoryState state, std::size_t bytes) override {
    return inner_->allocate_collective_memory(fallback, state, bytes);
  }

 protected:
  void run_backend(const Operation& operation) override {
    if (!skips(operation)) inner_->run(operation);
  }
  std::unique_ptr<PendingOperation> start_backend(const Operation& operation) override {
    return std::make_unique<ForwardedOperation>(skips(operation) ? Request{} : inner_->start(operation));
  }

 private:
  bool skips(const Operation& operation) {
    if (operation.op != plan_.op || operation.type != plan_.type) return false;
    return ++seen_ == plan_.occurrence;
  }
  std::unique_ptr<Communicator> inner_;
  FaultPlan plan_;
  int seen_ = 0;
};

}  // namespace

std::optional<FaultPlan> fault_plan_from_environment() {
  const char* text = std::getenv("MLPTRAIN_FAULT");
  if (text == nullptr) return std::nullopt;
  std::vector<std::string> fields;
  std::istringstream stream(text);
  for (std::string field; std::getline(stream, field, ':');) fields.push_back(field);
  const auto bad = [&] {
    return UsageError(std::string("MLPTRAIN_FAULT='") + text +
                      "': expected RANK:GROUP:OP:TYPE:N, e.g. 1:world:all_reduce:fp64:3");
  };
  if (fields.size() != 5) throw bad();
  FaultPlan plan{.group = fields[1]};
  try {
    plan.world_rank = std::stoi(fields[0]);
    plan.occurrence = std::stoi(fields[4]);
  } catch (const std::exception&) {
    throw bad();
  }
  bool op_found = false, type_found = false;
  for (CommOp op : all_comm_ops)
    if (comm_op_name(op) == fields[2]) plan.op = op, op_found = true;
  for (DataType type : {DataType::float32, DataType::float64, DataType::int32, DataType::int64})
    if (data_type_name(type) == fields[3]) plan.type = type, type_found = true;
  if (!op_found || !type_found || plan.occurrence < 1) throw bad();
  return plan;
}

std::unique_ptr<Communicator> with_fault(std::unique_ptr<Communicator> inner, int world_rank,
                                         const FaultPlan& plan) {
  if (world_rank != plan.world_rank || inner->group() != plan.group) return inner;
  return std::make_unique<SkippingCommunicator>(std::move(inner), plan);
}

}  // namespace mlptrain
