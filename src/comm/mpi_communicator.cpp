// MPI calls behind the Communicator interface. Counts and displacements of variable all-to-all
// are converted to MPI's int arrays and kept alive with the request until it completes.
#include "comm/mpi_communicator.hpp"

#include <climits>

#include "core/error.hpp"

namespace mlptrain {

namespace {

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
    case DataType::uint8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp reduce) {
  switch (reduce) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int mpi_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw RuntimeFailure("message of " + std::to_string(count) +
                         " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

// Per-rank counts and packed displacements for MPI_Alltoallv.
struct VariableLayout {
  std::vector<int> send_counts, send_offsets, receive_counts, receive_offsets;

  explicit VariableLayout(const Operation& operation) {
    fill(operation.send_counts, send_counts, send_offsets);
    fill(operation.receive_counts, receive_counts, receive_offsets);
  }
  static void fill(const std::vector<std::size_t>& counts, std::vector<int>& out_counts,
                   std::vector<int>& out_offsets) {
    std::size_t offset = 0;
    for (std::size_t count : counts) {
      out_counts.push_back(mpi_count(count));
      out_offsets.push_back(mpi_count(offset));
      offset += count;
    }
  }
};

class MpiPending final : public PendingOperation {
 public:
  std::unique_ptr<VariableLayout> layout;  // kept alive until completion
  MPI_Request request = MPI_REQUEST_NULL;

  bool test() override {
    int flag = 0;
    MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }
  void wait() override { MPI_Wait(&request, MPI_STATUS_IGNORE); }
};

const void* send_or_in_place(const Operation& operation) {
  return operation.send == operation.receive ? MPI_IN_PLACE : operation.send;
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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string group, CommLedger& ledger)
    : Communicator(std::move(group), ledger), comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  window_allocator_.reset();
  window_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::barrier() { MPI_Barrier(comm_); }

Buffer MpiCommunicator::allocate_reduction_memory(Allocator& fallback, MemoryState state,
                                                  std::size_t bytes) {
  // One window per communicator; every rank decides alike, so the collective calls match.
  if (size_ == 1 || window_ != nullptr || !group_shares_node(comm_))
    return fallback.allocate(state, bytes);
  window_ = std::make_unique<SharedWindow>(comm_, bytes);
  window_allocator_ = std::make_unique<WindowAllocator>(fallback.ledger(), *window_);
  return window_allocator_->allocate(state, bytes);
}

std::unique_ptr<PendingOperation> MpiCommunicator::start_shared_sum(const Operation& operation) {
  const bool shared = window_ != nullptr && operation.op == CommOp::all_reduce &&
                      operation.type == DataType::float32 && operation.reduce == ReduceOp::sum &&
                      operation.send == operation.receive &&
                      window_->contains(operation.receive, operation.count * sizeof(float));
  if (!shared) return nullptr;
  return window_->start_sum(static_cast<float*>(operation.receive), operation.count);
}

void MpiCommunicator::run_backend(const Operation& operation) {
  if (auto pending = start_shared_sum(operation)) {
    pending->wait();
    return;
  }
  const MPI_Datatype type = mpi_type(operation.type);
  const int count = mpi_count(operation.count);
  switch (operation.op) {
    case CommOp::all_reduce:
      MPI_Allreduce(send_or_in_place(operation), operation.receive, count, type,
                    mpi_op(operation.reduce), comm_);
      return;
    case CommOp::reduce_scatter:
      MPI_Reduce_scatter_block(operation.send, operation.receive, count, type,
                               mpi_op(operation.reduce), comm_);
      return;
    case CommOp::all_gather:
      MPI_Allgather(operation.send, count, type, operation.receive, count, type, comm_);
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
  }
}

std::unique_ptr<PendingOperation> MpiCommunicator::start_backend(const Operation& operation) {
  if (auto shared = start_shared_sum(operation)) return shared;
  auto pending = std::make_unique<MpiPending>();
  MPI_Request* request = &pending->request;
  const MPI_Datatype type = mpi_type(operation.type);
  const int count = mpi_count(operation.count);
  switch (operation.op) {
    case CommOp::all_reduce:
      MPI_Iallreduce(send_or_in_place(operation), operation.receive, count, type,
                     mpi_op(operation.reduce), comm_, request);
      break;
    case CommOp::reduce_scatter:
      MPI_Ireduce_scatter_block(operation.send, operation.receive, count, type,
                                mpi_op(operation.reduce), comm_, request);
      break;
    case CommOp::all_gather:
      MPI_Iallgather(operation.send, count, type, operation.receive, count, type, comm_, request);
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
  }
  return pending;
}

}  // namespace mlptrain
