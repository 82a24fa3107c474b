// One process group's communication. Every operation is described by an Operation value and
// handed to a backend (MPI, or NCCL on GPUs) through two entry points, blocking and non-blocking;
// this base class records each completed operation in the comm ledger under the group's name, so
// no backend and no caller can forget to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/comm_ledger.hpp"
#include "core/buffer.hpp"
#include "core/data_type.hpp"

namespace mlptrain {

enum class ReduceOp { sum, max, min };

// What `count` means per op: all_reduce, reduce and broadcast, the buffer; reduce_scatter and
// scatter, the elements each rank receives; all_gather and gather, the elements each rank
// contributes; all_to_all, the elements sent to each rank (or per-rank counts in
// send_counts/receive_counts when variable); send and recv, the message. Variable all-to-all data
// is packed by destination rank, in rank order. `peer` is the root of broadcast, reduce, gather
// and scatter (only the root's receive buffer of reduce and gather, and its send buffer of
// scatter, are used). With send == receive, all_reduce and reduce work in place, and so do the
// block operations, on a buffer of count x size elements on every rank: reduce_scatter and
// scatter leave this rank's result in its own block (at rank x count), all_gather and gather
// take its contribution from there. After an in-place reduce-scatter or scatter the other blocks
// are undefined.
struct Operation {
  CommOp op = CommOp::all_reduce;
  const void* send = nullptr;
  void* receive = nullptr;
  std::size_t count = 0;
  std::vector<std::size_t> send_counts;
  std::vector<std::size_t> receive_counts;
  DataType type = DataType::float32;
  ReduceOp reduce = ReduceOp::sum;
  int peer = 0;  // the root, or send/recv partner
  int tag = 0;

  // Bytes in nccl-tests' size convention, for a group of `group_size` ranks.
  std::int64_t ledger_bytes(int group_size) const;
};

// A backend's in-flight operation.
class PendingOperation {
 public:
  virtual ~PendingOperation() = default;
  virtual bool test() = 0;  // true once complete
  virtual void wait() = 0;
  // When it completed (core/timer.hpp's clock), once test() or wait() said so: where a thread of
  // the backend's own saw it complete, that time, else now.
  virtual double completed_at_ms() const;
};

// Handle to a non-blocking operation; completing it (test() true, or wait()) records its time in
// the ledger (its bytes were recorded when it was posted). Dropping an incomplete request waits
// for it.
class Request {
 public:
  Request() = default;
  Request(std::unique_ptr<PendingOperation> pending, CommLedger* ledger, std::string group,
          CommOp op, std::int64_t bytes, DataType type, std::uint64_t sequence, double start_ms);
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  ~Request();

  bool test();
  void wait();
  bool done() const { return pending_ == nullptr; }

 private:
  void finish();
  std::unique_ptr<PendingOperation> pending_;
  CommLedger* ledger_ = nullptr;
  std::string group_;
  CommOp op_ = CommOp::all_reduce;
  std::int64_t bytes_ = 0;
  DataType type_ = DataType::float32;
  std::uint64_t sequence_ = 0;
  double start_ms_ = 0;
};

class Communicator {
 public:
  Communicator(std::string group, CommLedger& ledger) : group_(std::move(group)), ledger_(ledger) {}
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  const std::string& group() const { return group_; }
  CommLedger& ledger() { return ledger_; }

  void run(const Operation& operation);
  Request start(const Operation& operation);
  virtual void barrier() = 0;

  // Memory for buffers this group runs collectives on often (gradients, parameter shards),
  // charged to `state`. A backend may place it where its collectives are fastest; by default it
  // comes from `fallback`. Collective over the group: every rank calls it at the same point, the
  // first call too (the MPI backend asks then whether the group shares a node).
  virtual Buffer allocate_collective_memory(Allocator& fallback, MemoryState state,
                                            std::size_t bytes) {
    return fallback.allocate(state, bytes);
  }

  // Sums of elements of a run-time type (fp32, bf16, fp16: training's tensors), in place.
  void all_reduce(void* data, std::size_t count, DataType type) {
    run(all_reduce_operation(data, count, type, ReduceOp::sum));
  }
  Request all_reduce_async(void* data, std::size_t count, DataType type) {
    return start(all_reduce_operation(data, count, type, ReduceOp::sum));
  }
  // Row blocks: rank r's block of `send` (at r x count) summed into `receive` (count elements),
  // and each rank's `send` (count elements) gathered into `receive` in rank order.
  void reduce_scatter(const void* send, void* receive, std::size_t receive_count, DataType type) {
    run({.op = CommOp::reduce_scatter, .send = send, .receive = receive, .count = receive_count, .type = type});
  }
  void all_gather(const void* send, void* receive, std::size_t send_count, DataType type) {
    run({.op = CommOp::all_gather, .send = send, .receive = receive, .count = send_count, .type = type});
  }
  Request reduce_scatter_in_place_async(void* data, std::size_t count_per_rank, DataType type) {
    return start({.op = CommOp::reduce_scatter, .send = data, .receive = data, .count = count_per_rank, .type = type});
  }
  Request all_gather_in_place_async(void* data, std::size_t count_per_rank, DataType type) {
    return start({.op = CommOp::all_gather, .send = data, .receive = data, .count = count_per_rank, .type = type});
  }
  void all_to_all_variable(const void* send, std::vector<std::size_t> send_counts, void* receive,
                           std::vector<std::size_t> receive_counts, DataType type) {
    run({.op = CommOp::all_to_all, .send = send, .receive = receive, .send_counts = std::move(send_counts),
         .receive_counts = std::move(receive_counts), .type = type});
  }

  // Typed conveniences for the common cases.
  template <typename T>
  void all_reduce(T* data, std::size_t count, ReduceOp reduce = ReduceOp::sum) {
    run(all_reduce_operation(data, count, data_type_of<T>(), reduce));
  }
  template <typename T>
  Request all_reduce_async(T* data, std::size_t count, ReduceOp reduce = ReduceOp::sum) {
    return start(all_reduce_operation(data, count, data_type_of<T>(), reduce));
  }
  template <typename T>
  void reduce_scatter(const T* send, T* receive, std::size_t receive_count) {
    run({.op = CommOp::reduce_scatter, .send = send, .receive = receive, .count = receive_count,
         .type = data_type_of<T>()});
  }
  template <typename T>
  void all_gather(const T* send, T* receive, std::size_t send_count) {
    run({.op = CommOp::all_gather, .send = send, .receive = receive, .count = send_count,
         .type = data_type_of<T>()});
  }
  template <typename T>
  void broadcast(T* data, std::size_t count, int root) {
    run({.op = CommOp::broadcast, .receive = data, .count = count, .type = data_type_of<T>(),
         .peer = root});
  }
  template <typename T>
  void all_to_all(const T* send, T* receive, std::size_t count_per_rank) {
    run({.op = CommOp::all_to_all, .send = send, .receive = receive, .count = count_per_rank,
         .type = data_type_of<T>()});
  }
  template <typename T>
  void all_to_all_variable(const T* send, std::vector<std::size_t> send_counts, T* receive,
                           std::vector<std::size_t> receive_counts) {
    run({.op = CommOp::all_to_all, .send = send, .receive = receive,
         .send_counts = std::move(send_counts), .receive_counts = std::move(receive_counts),
         .type = data_type_of<T>()});
  }
  template <typename T>
  void send(const T* data, std::size_t count, int peer, int tag = 0) {
    run({.op = CommOp::send, .send = data, .count = count, .type = data_type_of<T>(), .peer = peer,
         .tag = tag});
  }
  template <typename T>
  void recv(T* data, std::size_t count, int peer, int tag = 0) {
    run({.op = CommOp::recv, .receive = data, .count = count, .type = data_type_of<T>(),
         .peer = peer, .tag = tag});
  }

 protected:
  virtual void run_backend(const Operation& operation) = 0;
  virtual std::unique_ptr<PendingOperation> start_backend(const Operation& operation) = 0;

 private:
  static Operation all_reduce_operation(void* data, std::size_t count, DataType type,
                                        ReduceOp reduce) {
    return {.op = CommOp::all_reduce, .send = data, .receive = data, .count = count, .type = type,
            .reduce = reduce};
  }
  std::string group_;
  CommLedger& ledger_;
};

}  // namespace mlptrain
