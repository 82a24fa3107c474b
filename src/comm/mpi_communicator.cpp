// MPI calls behind the Communicator interface. Counts and displacements of variable all-to-all
// are converted to MPI's int arrays and kept alive with the request until it completes.
#include "comm/mpi_communicator.hpp"

#include <climits>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/engine_tasks.hpp"
#include "comm/mpi_types.hpp"
#include "core/error.hpp"

namespace mlptrain {

// A non-blocking MPI call; `on_completion` runs once, when it completes.
class MpiPending final : public PendingOperation {
 public:
  std::unique_ptr<VariableLayout> layout;  // kept alive until completion
  MPI_Request request = MPI_REQUEST_NULL;
  std::function<void()> on_completion;     // run once, when the request completes

  bool test() override {
    int flag = 0;
    MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    if (flag != 0) complete();
    return flag != 0;
  }
  void wait() override {
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    complete();
  }

 private:
  void complete() {
    if (on_completion) std::exchange(on_completion, nullptr)();
  }
};

namespace {

bool in_place(const Operation& operation) { return operation.send == operation.receive; }

const void* send_or_in_place(const Operation& operation) {
  return in_place(operation) ? MPI_IN_PLACE : operation.send;
}

// MPI's in-place reduce-scatter leaves the result at the start of the buffer; ours is in place in
// the rank's own block.
void move_to_own_block(const Operation& operation, int rank) {
  const std::size_t bytes = operation.count * size_of(operation.type);
  char* data = static_cast<char*>(operation.receive);
  if (rank > 0) std::memmove(data + static_cast<std::size_t>(rank) * bytes, data, bytes);
}

// MPI's buffers for a rooted operation (reduce, gather, scatter) under Operation's in-place
// convention: MPI_IN_PLACE at the root, and at the other ranks their own block of the buffer.
struct RootedBuffers {
  const void* send = nullptr;
  void* receive = nullptr;
};

RootedBuffers rooted_buffers(const Operation& operation, int rank) {
  if (!in_place(operation)) return {operation.send, operation.receive};
  const bool root = rank == operation.peer;
  char* own_block = static_cast<char*>(operation.receive) +
                    static_cast<std::size_t>(rank) * operation.count * size_of(operation.type);
  switch (operation.op) {
    case CommOp::reduce: return {root ? MPI_IN_PLACE : operation.send, root ? operation.receive : nullptr};
    case CommOp::gather: return {root ? MPI_IN_PLACE : own_block, operation.receive};
    case CommOp::scatter: return {operation.send, root ? MPI_IN_PLACE : own_block};
    default: return {operation.send, operation.receive};
  }
}

// Hands out the window's one segment as a Buffer charged to the ledger.
class WindowAllocator final : public Allocator {
 public:
  WindowAllocator(MemoryLedger& ledger, SharedWindow& window) : Allocator(ledger), window_(window) {}
  Device device() const override { return Device::cpu; }

 protected:
  void* obtain(std::size_t bytes) override {
    if (handed_out_ || bytes > window_.segment_bytes())
      throw RuntimeFailure("the shared reduction window is already in use");
    handed_out_ = true;
    return window_.local_segment();
  }
  void give_back(void*, std::size_t) override { handed_out_ = false; }

 private:
  SharedWindow& window_;
  bool handed_out_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string group, CommLedger& ledger,
                                 bool shared_memory, CommEngine* engine, HostStaging* staging)
    : Communicator(std::move(group), ledger), comm_(comm), engine_(engine), staging_(staging) {
  if (staging_ != nullptr && engine_ == nullptr) throw std::logic_error("host staging runs on a communication engine");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  shared_memory_ = shared_memory && size_ > 1;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Nothing of this group may be in flight when its windows and communicator go; but waiting
  // needs the other ranks: not while unwinding from an error they may not share.
  if (engine_ != nullptr && !finalized && std::uncaught_exceptions() == 0) engine_->drain();
  window_allocators_.clear();
  windows_.clear();
  const bool predefined = comm_ == MPI_COMM_WORLD || comm_ == MPI_COMM_SELF || comm_ == MPI_COMM_NULL;
  if (!finalized && !predefined) MPI_Comm_free(&comm_);
}

void MpiCommunicator::barrier() {
  if (engine_ != nullptr) engine_->drain();  // the group's earlier collectives are issued first
  MPI_Barrier(comm_);
}

Buffer MpiCommunicator::allocate_collective_memory(Allocator& fallback, MemoryState state,
                                                   std::size_t bytes) {
  // Every rank decides alike, so the collective calls match. Windows are host memory: a
  // device's buffers stay on the device.
  if (!shared_memory_ || fallback.device() != Device::cpu) return fallback.allocate(state, bytes);
  // The calls below are collectives of this group outside the engine: after its tasks.
  if (engine_ != nullptr) engine_->drain();
  // Asked once, on first use: finding the node's ranks is slow when ranks outnumber cores, and
  // most groups never ask.
  if (!shares_node_) shares_node_ = group_shares_node(comm_);
  if (!*shares_node_) return fallback.allocate(state, bytes);
  windows_.push_back(std::make_unique<SharedWindow>(comm_, bytes));
  window_allocators_.push_back(std::make_unique<WindowAllocator>(fallback.ledger(), *windows_.back()));
  return window_allocators_.back()->allocate(state, bytes);
}

std::unique_ptr<PendingOperation> MpiCommunicator::start_shared(const Operation& operation) {
  const bool summable = operation.type == DataType::float32 || is_half(operation.type);
  if (!summable || operation.send != operation.receive) return nullptr;
  SharedWindow::Kind kind;
  std::size_t count = operation.count;
  switch (operation.op) {
    case CommOp::all_reduce:
      if (operation.reduce != ReduceOp::sum) return nullptr;
      kind = SharedWindow::Kind::sum;
      break;
    case CommOp::reduce_scatter:
      if (operation.reduce != ReduceOp::sum) return nullptr;
      kind = SharedWindow::Kind::sum_scatter;
      count *= static_cast<std::size_t>(size_);
      break;
    case CommOp::all_gather:
      kind = SharedWindow::Kind::gather;
      count *= static_cast<std::size_t>(size_);
      break;
    default: return nullptr;
  }
  for (const auto& window : windows_)
    if (window->contains(operation.receive, count * size_of(operation.type)))
      return window->start(kind, operation.receive, count, operation.type);
  return nullptr;
}

void MpiCommunicator::run_backend(const Operation& operation) {
  if (engine_ != nullptr) {
    engine_->submit_and_wait(*task(operation));
    return;
  }
  if (auto pending = start_shared(operation)) {
    pending->wait();
    return;
  }
  run_host(operation);
}

std::unique_ptr<EngineTask> MpiCommunicator::task(const Operation& operation) {
  IssueChannel channel{.comm = comm_};
  if (operation.op == CommOp::send) channel = {.comm = comm_, .kind = IssueChannel::Kind::send, .peer = operation.peer};
  if (operation.op == CommOp::recv) channel = {.comm = comm_, .kind = IssueChannel::Kind::receive, .peer = operation.peer};
  if (staging_ != nullptr && staging_->stages(operation))
    return staging_->task(operation, rank_, size_, channel,
                          [this](const Operation& host) -> std::unique_ptr<PendingOperation> { return start_host(host); });
  return std::make_unique<CallTask>(channel, [this, operation] { return start_on_host(operation); });
}

std::unique_ptr<PendingOperation> MpiCommunicator::start_on_host(const Operation& operation) {
  if (auto shared = start_shared(operation)) return shared;
  return start_host(operation);
}

void MpiCommunicator::run_host(const Operation& operation) {
  const MPI_Datatype type = mpi_type(operation.type);
  const int count = mpi_count(operation.count);
  switch (operation.op) {
    case CommOp::all_reduce:
      MPI_Allreduce(send_or_in_place(operation), operation.receive, count, type,
                    mpi_op(operation.reduce, operation.type, half_sums_), comm_);
      return;
    case CommOp::reduce_scatter:
      MPI_Reduce_scatter_block(send_or_in_place(operation), operation.receive, count, type,
                               mpi_op(operation.reduce, operation.type, half_sums_), comm_);
      if (in_place(operation)) move_to_own_block(operation, rank_);
      return;
    case CommOp::all_gather:
      // In place, each rank's contribution already sits in its own block of the output.
      MPI_Allgather(send_or_in_place(operation), in_place(operation) ? 0 : count, type,
                    operation.receive, count, type, comm_);
      return;
    case CommOp::broadcast:
      MPI_Bcast(operation.receive, count, type, operation.peer, comm_);
      return;
    case CommOp::all_to_all:
      if (!operation.send_counts.empty()) {
        const VariableLayout layout(operation);
        MPI_Alltoallv(operation.send, layout.send_counts.data(), layout.send_offsets.data(), type,
                      operation.receive, layout.receive_counts.data(),
                      layout.receive_offsets.data(), type, comm_);
      } else {
        MPI_Alltoall(operation.send, count, type, operation.receive, count, type, comm_);
      }
      return;
    case CommOp::send:
      MPI_Send(operation.send, count, type, operation.peer, operation.tag, comm_);
      return;
    case CommOp::recv:
      MPI_Recv(operation.receive, count, type, operation.peer, operation.tag, comm_,
               MPI_STATUS_IGNORE);
      return;
    case CommOp::reduce:  // through the non-blocking call, which sets up the rooted buffers
    case CommOp::gather:
    case CommOp::scatter: start_host(operation)->wait(); return;
  }
}

std::unique_ptr<PendingOperation> MpiCommunicator::start_backend(const Operation& operation) {
  if (engine_ == nullptr) return start_on_host(operation);
  std::unique_ptr<EngineTask> started = task(operation);
  engine_->submit(*started);
  return std::make_unique<EnginePending>(*engine_, std::move(started));
}

std::unique_ptr<MpiPending> MpiCommunicator::start_host(const Operation& operation) {
  auto pending = std::make_unique<MpiPending>();
  MPI_Request* request = &pending->request;
  const MPI_Datatype type = mpi_type(operation.type);
  const int count = mpi_count(operation.count);
  switch (operation.op) {
    case CommOp::all_reduce:
      MPI_Iallreduce(send_or_in_place(operation), operation.receive, count, type,
                     mpi_op(operation.reduce, operation.type, half_sums_), comm_, request);
      break;
    case CommOp::reduce_scatter:
      MPI_Ireduce_scatter_block(send_or_in_place(operation), operation.receive, count, type,
                                mpi_op(operation.reduce, operation.type, half_sums_), comm_, request);
      if (in_place(operation))
        pending->on_completion = [operation, rank = rank_] { move_to_own_block(operation, rank); };
      break;
    case CommOp::all_gather:
      MPI_Iallgather(send_or_in_place(operation), in_place(operation) ? 0 : count, type,
                     operation.receive, count, type, comm_, request);
      break;
    case CommOp::broadcast:
      MPI_Ibcast(operation.receive, count, type, operation.peer, comm_, request);
      break;
    case CommOp::all_to_all:
      if (!operation.send_counts.empty()) {
        pending->layout = std::make_unique<VariableLayout>(operation);
        const VariableLayout& layout = *pending->layout;
        MPI_Ialltoallv(operation.send, layout.send_counts.data(), layout.send_offsets.data(), type,
                       operation.receive, layout.receive_counts.data(),
                       layout.receive_offsets.data(), type, comm_, request);
      } else {
        MPI_Ialltoall(operation.send, count, type, operation.receive, count, type, comm_, request);
      }
      break;
    case CommOp::send:
      MPI_Isend(operation.send, count, type, operation.peer, operation.tag, comm_, request);
      break;
    case CommOp::recv:
      MPI_Irecv(operation.receive, count, type, operation.peer, operation.tag, comm_, request);
      break;
    case CommOp::reduce: {
      const RootedBuffers buffers = rooted_buffers(operation, rank_);
      MPI_Ireduce(buffers.send, buffers.receive, count, type, mpi_op(operation.reduce, operation.type, half_sums_),
                  operation.peer, comm_, request);
      break;
    }
    case CommOp::gather: {
      const RootedBuffers buffers = rooted_buffers(operation, rank_);
      MPI_Igather(buffers.send, count, type, buffers.receive, count, type, operation.peer, comm_, request);
      break;
    }
    case CommOp::scatter: {
      const RootedBuffers buffers = rooted_buffers(operation, rank_);
      MPI_Iscatter(buffers.send, count, type, buffers.receive, count, type, operation.peer, comm_, request);
      break;
    }
  }
  return pending;
}

}  // namespace mlptrain
