// One commbench measurement's case (see commbench_case.hpp).
#include "bench/commbench_case.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "bench/commbench_options.hpp"
#include "core/half_float.hpp"
#include "core/timer.hpp"

namespace mlptrain {

namespace {

constexpr int root = 0;

// A value every rank can compute for (rank, element): small integers below `range`, chosen so that
// a sum over every rank stays an integer the element type holds exactly (bf16: up to 256).
float value(int rank, std::size_t element, int range) {
  return static_cast<float>((rank * 7 + static_cast<int>(element % 61) * 3) % range);
}

bool is_sum(const std::string& collective) {
  return collective == "all_reduce" || collective == "reduce" || collective == "mpi_all_reduce";
}

bool per_rank(const std::string& collective) {
  return collective == "reduce_scatter" || collective == "all_gather" || collective == "all_to_all" ||
         collective == "gather" || collective == "scatter";
}

CommOp plain_op(const std::string& collective) {
  if (collective == "all_reduce") return CommOp::all_reduce;
  if (collective == "reduce_scatter") return CommOp::reduce_scatter;
  if (collective == "all_gather") return CommOp::all_gather;
  if (collective == "all_to_all") return CommOp::all_to_all;
  if (collective == "reduce") return CommOp::reduce;
  if (collective == "gather") return CommOp::gather;
  if (collective == "scatter") return CommOp::scatter;
  throw std::logic_error("commbench: '" + collective + "' is not a plain operation");
}

}  // namespace

bool CollectiveCase::has_in_place(const std::string& collective) {
  return is_sum(collective) || collective == "reduce_scatter" || collective == "all_gather" ||
         collective == "gather" || collective == "scatter";
}

bool CollectiveCase::takes_block() const { return collective_ == "all_gather" || collective_ == "gather"; }
bool CollectiveCase::leaves_block() const { return collective_ == "reduce_scatter" || collective_ == "scatter"; }

float CollectiveCase::value_of(int rank, std::size_t element) const {
  if (!rounds_) return value(rank, element, range_);
  return 1.0f + static_cast<float>((rank * 37 + static_cast<int>(element % 127) * 11) % 128) / 128.0f;
}

float CollectiveCase::input(std::size_t element) const { return value_of(rank_, element); }

CollectiveCase::CollectiveCase(const std::string& collective, std::int64_t bytes, DataType type, bool in_place,
                               Communicator& group, MPI_Comm raw, Allocator* device, AsyncCopier* copier)
    : collective_(collective),
      type_(type),
      in_place_(in_place && has_in_place(collective)),
      group_(group),
      raw_(raw),
      rank_(group.rank()),
      ranks_(group.size()),
      device_(device),
      copier_(copier) {
  const std::size_t element = size_of(type);
  const auto blocks = static_cast<std::size_t>(per_rank(collective) ? ranks_ : 1);
  range_ = type == DataType::float32 ? 64 : std::clamp(256 / ranks_, 2, 64);
  rounds_ = is_half(type) && (is_sum(collective) || collective == "reduce_scatter");
  count_ = static_cast<std::size_t>(bytes) / element / blocks;
  whole_ = count_ * blocks;
  bytes_ = static_cast<std::int64_t>(whole_ * element);
  if (!in_place_) send_.resize((takes_block() ? count_ : whole_) * element);
  receive_.resize((leaves_block() && !in_place_ ? count_ : whole_) * element);
  if (device_ != nullptr) {
    if (!send_.empty()) send_device_ = device_->allocate(MemoryState::comm_buffers, send_.size());
    receive_device_ = device_->allocate(MemoryState::comm_buffers, receive_.size());
  }
  if (is_device_copy(collective)) pinned_ = copier_->host_memory().allocate(MemoryState::comm_buffers, whole_ * element);
  // What this rank checks: nothing of a reduce or a gather but at the root; its own block of
  // what leaves one block (at its place in the buffer, in place); else the whole result.
  const auto r = static_cast<std::size_t>(rank_);
  const bool to_root = collective == "reduce" || collective == "gather";
  const std::size_t checked = to_root && rank_ != root ? 0 : leaves_block() ? count_ : whole_;
  check_offset_ = leaves_block() && in_place_ ? r * count_ : 0;
  const auto of = [this](int source, std::size_t index) { return value_of(source, index); };
  expected_.resize(checked);
  // The unit roundoff of the format, for the bound of a rounded sum (the header says which).
  const double unit = type == DataType::bfloat16 ? 0x1p-8 : 0x1p-11;
  if (rounds_) bounds_.resize(checked);
  for (std::size_t index = 0; index < checked; ++index) {
    const std::size_t block = index / std::max<std::size_t>(count_, 1), within = index % std::max<std::size_t>(count_, 1);
    float sum = 0;
    if (is_sum(collective) || collective == "reduce_scatter") {
      const std::size_t at = is_sum(collective) ? index : r * count_ + index;
      for (int source = 0; source < ranks_; ++source) sum += of(source, at);
      // Every input is positive: sum|x| is the sum itself.
      if (rounds_) bounds_[index] = static_cast<float>(ranks_ * unit * sum);
    } else if (collective == "all_gather" || collective == "gather") {
      sum = of(static_cast<int>(block), within);
    } else if (collective == "all_to_all") {  // block s came from rank s: its block for me
      sum = of(static_cast<int>(block), r * count_ + within);
    } else if (collective == "scatter") {
      sum = of(root, r * count_ + index);
    } else if (collective == "broadcast") {
      sum = of(root, index);
    } else if (is_device_copy(collective)) {
      sum = of(rank_, index);
    } else {  // send_recv around the ring: from the previous rank
      sum = of((rank_ + ranks_ - 1) % ranks_, index);
    }
    expected_[index] = sum;
  }
}

void CollectiveCase::fill() {
  const std::size_t own = static_cast<std::size_t>(rank_) * count_;
  for (std::size_t index = 0; index < send_.size() / size_of(type_); ++index)
    store_element(send_.data(), index, type_, input(index));
  for (std::size_t index = 0; index < receive_.size() / size_of(type_); ++index) {
    float initial = -1.0f;  // poison, unless the buffer is (part of) the input
    if (collective_ == "broadcast" && rank_ == root) initial = input(index);
    if (in_place_) {
      if (takes_block() && index >= own && index < own + count_) initial = input(index - own);
      if (!takes_block() && (collective_ != "scatter" || rank_ == root)) initial = input(index);
    }
    store_element(receive_.data(), index, type_, initial);
  }
  if (!pinned_.empty())
    for (std::size_t index = 0; index < whole_; ++index)
      store_element(pinned_.as<void>(), index, type_, collective_ == "copy_to_device" ? input(index) : -1.0f);
  if (device_ == nullptr) return;
  if (!send_.empty()) device_->copy_to_device(send_device_.as<void>(), send_.data(), send_.size());
  device_->copy_to_device(receive_device_.as<void>(), receive_.data(), receive_.size());
}

bool CollectiveCase::can_start(const std::string& collective) {
  return !is_device_copy(collective) && collective != "mpi_all_reduce";
}

void CollectiveCase::run(Issue issue, double compute_us) {
  void* receive = device_ != nullptr ? receive_device_.as<void>() : receive_.data();
  void* send = in_place_ ? receive : device_ != nullptr ? send_device_.as<void>() : send_.data();
  const auto bytes = static_cast<std::size_t>(bytes_);
  const auto compute = [compute_us] {
    for (const double until = now_ms() + compute_us / 1000.0; now_ms() < until;) {
    }
  };
  // The operations of this case (a ring's send and receive, or one collective).
  std::vector<Operation> operations;
  if (collective_ == "broadcast") {
    operations.push_back({.op = CommOp::broadcast, .receive = receive, .count = whole_, .type = type_, .peer = root});
  } else if (collective_ == "send_recv") {
    operations.push_back({.op = CommOp::recv, .receive = receive, .count = count_, .type = type_,
                          .peer = (rank_ + ranks_ - 1) % ranks_});
    operations.push_back({.op = CommOp::send, .send = send, .count = count_, .type = type_, .peer = (rank_ + 1) % ranks_});
  } else if (can_start(collective_)) {
    operations.push_back({.op = plain_op(collective_), .send = send, .receive = receive, .count = count_, .type = type_,
                          .peer = root});
  }
  // A ring's two halves are always started together: run one after the other they would deadlock.
  if (issue == Issue::started || operations.size() > 1) {
    std::vector<Request> started;
    for (const Operation& operation : operations) started.push_back(group_.start(operation));
    compute();
    for (Request& request : started) request.wait();
    return;
  }
  if (!operations.empty()) {
    group_.run(operations.front());
    return;
  }
  if (collective_ == "copy_to_host") {
    copier_->start_to_host(0, pinned_.as<void>(), send, bytes);
    copier_->wait_to_host(0);
  } else if (collective_ == "copy_to_device") {
    copier_->start_to_device(0, receive, pinned_.as<void>(), bytes);
    copier_->wait_to_device(0);
  } else if (collective_ == "mpi_all_reduce") {  // fp32 on host buffers (the options see to it)
    MPI_Allreduce(in_place_ ? MPI_IN_PLACE : send, receive, static_cast<int>(count_), MPI_FLOAT, MPI_SUM, raw_);
  }
}

std::size_t CollectiveCase::wrong_elements() {
  const void* result = receive_.data();
  if (collective_ == "copy_to_host") {
    result = pinned_.as<void>();
  } else if (device_ != nullptr) {
    device_->copy_to_host(receive_.data(), receive_device_.as<void>(), receive_.size());
  }
  std::size_t wrong = 0;
  max_error_ = error_bound_ = 0;
  for (std::size_t index = 0; index < expected_.size(); ++index) {
    const double error = std::abs(static_cast<double>(load_element(result, check_offset_ + index, type_)) - expected_[index]);
    const double bound = rounds_ ? bounds_[index] : 0.0;
    wrong += !(error <= bound);  // a NaN is wrong too
    max_error_ = std::max(max_error_, error);
    error_bound_ = std::max(error_bound_, bound);
  }
  return wrong;
}

double CollectiveCase::bus_factor() const {
  if (collective_ == "mpi_all_reduce") return mlptrain::bus_factor(CommOp::all_reduce, ranks_);
  // A broadcast, a ring of sends and a device copy carry their whole size.
  if (collective_ == "broadcast" || collective_ == "send_recv" || is_device_copy(collective_)) return 1;
  return mlptrain::bus_factor(plain_op(collective_), ranks_);
}

}  // namespace mlptrain
