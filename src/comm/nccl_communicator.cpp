// NCCL collectives behind the Communicator interface (see nccl_communicator.hpp).
#include "comm/nccl_communicator.hpp"

#include "core/error.hpp"

#ifdef MLPTRAIN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/mpi_communicator.hpp"
#endif

namespace mlptrain {

#ifndef MLPTRAIN_HAVE_NCCL

bool nccl_backend_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, std::string, CommLedger&, void*) {
  throw UsageError("--comm nccl: this build has no NCCL backend (nvcc and nccl.h were not found "
                   "when it was configured)");
}

#else

bool nccl_backend_built() { return true; }

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(status));
}

void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess)
    throw RuntimeFailure(std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(status));
}

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::int32: return ncclInt32;
    case DataType::int64: return ncclInt64;
    case DataType::uint8: return ncclUint8;
    case DataType::bfloat16: return ncclBfloat16;
    case DataType::float16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp reduce) {
  switch (reduce) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

bool on_device(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

// The event that fires when a batch of queued operations is done on the communication stream;
// recorded when the batch is handed to NCCL.
struct BatchEvent {
  cudaEvent_t event = nullptr;
  ~BatchEvent() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

// A started host-memory operation of the MPI side, as a pending operation of this backend.
class RequestPending final : public PendingOperation {
 public:
  explicit RequestPending(Request request) : request_(std::move(request)) {}
  bool test() override { return request_.test(); }
  void wait() override { request_.wait(); }

 private:
  Request request_;
};

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Comm_dup(comm, &copy);
  return copy;
}

class NcclCommunicator;

// An operation on the communication stream: complete once its batch's event has fired. A
// point-to-point transfer still waiting in the queue is handed to NCCL first.
class NcclPending final : public PendingOperation {
 public:
  NcclPending(NcclCommunicator& communicator, std::shared_ptr<BatchEvent> done)
      : communicator_(communicator), done_(std::move(done)) {}
  bool test() override;
  void wait() override;

 private:
  NcclCommunicator& communicator_;
  std::shared_ptr<BatchEvent> done_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string group, CommLedger& ledger, void* compute_stream)
      : Communicator(group, ledger),
        compute_stream_(static_cast<cudaStream_t>(compute_stream)),
        host_(duplicate(comm), group, host_ledger_, false) {
    ncclUniqueId id{};
    if (host_.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    if (comm != MPI_COMM_WORLD && comm != MPI_COMM_SELF) MPI_Comm_free(&comm);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(ncclCommInitRank(&nccl_, host_.size(), id, host_.rank()), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (!transfers_.empty()) flush_transfers();
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(nccl_);
    cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void barrier() override { host_.barrier(); }

  // Hands the queued point-to-point transfers to NCCL in one group call, so that they progress
  // together as MPI's non-blocking ones do: one stream runs NCCL's work in order, and a send
  // queued alone ahead of the receive its peer needs first would wait for ever.
  void flush_transfers() {
    order_after_compute();
    check(ncclGroupStart(), "ncclGroupStart");
    for (const Operation& transfer : transfers_) enqueue(transfer);
    check(ncclGroupEnd(), "ncclGroupEnd");
    transfers_.clear();
    record(*transfers_done_);
    transfers_done_.reset();
  }
  bool queued(const BatchEvent& done) const { return transfers_done_.get() == &done; }

 protected:
  void run_backend(const Operation& operation) override {
    if (on_host(operation)) {
      host_.run(operation);
      return;
    }
    start_backend(operation)->wait();
  }

  std::unique_ptr<PendingOperation> start_backend(const Operation& operation) override {
    if (on_host(operation)) return std::make_unique<RequestPending>(host_.start(operation));
    if (operation.op == CommOp::send || operation.op == CommOp::recv) {
      if (!transfers_done_) transfers_done_ = std::make_shared<BatchEvent>();
      transfers_.push_back(operation);
      return std::make_unique<NcclPending>(*this, transfers_done_);
    }
    if (!transfers_.empty()) flush_transfers();  // keep the order the operations were posted in
    order_after_compute();
    enqueue(operation);
    auto done = std::make_shared<BatchEvent>();
    record(*done);
    return std::make_unique<NcclPending>(*this, std::move(done));
  }

 private:
  static bool on_host(const Operation& operation) {
    return !on_device(operation.send) && !on_device(operation.receive);
  }

  // What follows on the communication stream waits for the compute stream's work so far (the
  // kernels that wrote the data), without the host waiting.
  void order_after_compute() {
    cudaEvent_t ready = nullptr;
    check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ready, compute_stream_), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once it has fired
  }

  void record(BatchEvent& done) {
    check(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(done.event, stream_), "cudaEventRecord");
  }

  // Queues `operation` on the communication stream.
  void enqueue(const Operation& operation) {
    const ncclDataType_t type = nccl_type(operation.type);
    const std::size_t element = size_of(operation.type);
    const auto self = static_cast<std::size_t>(rank());
    const bool in_place = operation.send == operation.receive;
    auto* receive = static_cast<std::byte*>(operation.receive);
    const auto* send = static_cast<const std::byte*>(operation.send);
    switch (operation.op) {
      case CommOp::all_reduce:
        check(ncclAllReduce(send, receive, operation.count, type, nccl_op(operation.reduce), nccl_,
                            stream_), "ncclAllReduce");
        break;
      case CommOp::reduce_scatter:  // in place: this rank's block of the buffer receives
        check(ncclReduceScatter(send, in_place ? receive + self * operation.count * element : receive,
                                operation.count, type, nccl_op(operation.reduce), nccl_, stream_),
              "ncclReduceScatter");
        break;
      case CommOp::all_gather:  // in place: this rank's block of the buffer is its contribution
        check(ncclAllGather(in_place ? send + self * operation.count * element : send, receive,
                            operation.count, type, nccl_, stream_), "ncclAllGather");
        break;
      case CommOp::broadcast:
        check(ncclBroadcast(receive, receive, operation.count, type, operation.peer, nccl_, stream_),
              "ncclBroadcast");
        break;
      case CommOp::send:
        check(ncclSend(send, operation.count, type, operation.peer, nccl_, stream_), "ncclSend");
        break;
      case CommOp::recv:
        check(ncclRecv(receive, operation.count, type, operation.peer, nccl_, stream_), "ncclRecv");
        break;
      case CommOp::all_to_all:
        all_to_all(operation, type, element);
        break;
      case CommOp::reduce:
        check(ncclReduce(send, receive, operation.count, type, nccl_op(operation.reduce), operation.peer, nccl_,
                         stream_), "ncclReduce");
        break;
      case CommOp::gather:
      case CommOp::scatter:
        rooted_blocks(operation, type, element);
        break;
    }
  }

  // Gather and scatter as nccl-tests builds them: one group call of the root's send or receive
  // per rank and every rank's one transfer with the root (none between the root and itself in
  // place, where its block already sits where it belongs).
  void rooted_blocks(const Operation& operation, ncclDataType_t type, std::size_t element) {
    const int root = operation.peer, self = rank();
    const bool in_place = operation.send == operation.receive;
    const std::size_t block = operation.count * element;
    const auto* send = static_cast<const std::byte*>(operation.send);
    auto* receive = static_cast<std::byte*>(operation.receive);
    const bool gather = operation.op == CommOp::gather;
    check(ncclGroupStart(), "ncclGroupStart");
    if (self == root)
      for (int peer = 0; peer < size(); ++peer) {
        if (peer == self && in_place) continue;
        const std::size_t at = static_cast<std::size_t>(peer) * block;
        if (gather) {
          check(ncclRecv(receive + at, operation.count, type, peer, nccl_, stream_), "ncclRecv");
        } else {
          check(ncclSend(send + at, operation.count, type, peer, nccl_, stream_), "ncclSend");
        }
      }
    if (!(self == root && in_place)) {
      const std::size_t own = in_place ? static_cast<std::size_t>(self) * block : 0;
      if (gather) {
        check(ncclSend((in_place ? receive : send) + own, operation.count, type, root, nccl_, stream_), "ncclSend");
      } else {
        check(ncclRecv(receive + own, operation.count, type, root, nccl_, stream_), "ncclRecv");
      }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  // Every pair's send and receive in one group call, packed by rank as Operation describes.
  void all_to_all(const Operation& operation, ncclDataType_t type, std::size_t element) {
    const auto ranks = static_cast<std::size_t>(size());
    const auto count_of = [&](const std::vector<std::size_t>& counts, std::size_t peer) {
      return counts.empty() ? operation.count : counts[peer];
    };
    const auto* send = static_cast<const std::byte*>(operation.send);
    auto* receive = static_cast<std::byte*>(operation.receive);
    check(ncclGroupStart(), "ncclGroupStart");
    std::size_t send_offset = 0, receive_offset = 0;
    for (std::size_t peer = 0; peer < ranks; ++peer) {
      const std::size_t out = count_of(operation.send_counts, peer);
      const std::size_t in = count_of(operation.receive_counts, peer);
      if (out > 0)
        check(ncclSend(send + send_offset * element, out, type, static_cast<int>(peer), nccl_, stream_),
              "ncclSend");
      if (in > 0)
        check(ncclRecv(receive + receive_offset * element, in, type, static_cast<int>(peer), nccl_,
                       stream_), "ncclRecv");
      send_offset += out;
      receive_offset += in;
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  cudaStream_t compute_stream_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  CommLedger host_ledger_;  // the base class records every operation once, in the run's ledger
  MpiCommunicator host_;
  std::vector<Operation> transfers_;             // sends and receives not yet handed to NCCL
  std::shared_ptr<BatchEvent> transfers_done_;  // their batch's event
};

bool NcclPending::test() {
  if (communicator_.queued(*done_)) communicator_.flush_transfers();
  const cudaError_t status = cudaEventQuery(done_->event);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

void NcclPending::wait() {
  if (communicator_.queued(*done_)) communicator_.flush_transfers();
  check(cudaEventSynchronize(done_->event), "cudaEventSynchronize");
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string group,
                                                     CommLedger& ledger, void* compute_stream) {
  return std::make_unique<NcclCommunicator>(comm, std::move(group), ledger, compute_stream);
}

#endif

}  // namespace mlptrain
