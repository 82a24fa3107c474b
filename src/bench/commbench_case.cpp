// One commbench measurement's case (see commbench_case.hpp).
#include "bench/commbench_case.hpp"

#include <algorithm>

#include "bench/commbench_options.hpp"
#include "core/half_float.hpp"

namespace mlptrain {

namespace {

// A value every rank can compute for (rank, element): small integers below `range`, chosen so that
// a sum over every rank stays an integer the element type holds exactly (bf16: up to 256).
float value(int rank, std::size_t element, int range) {
  return static_cast<float>((rank * 7 + static_cast<int>(element % 61) * 3) % range);
}

}  // namespace

CollectiveCase::CollectiveCase(const std::string& collective, std::int64_t bytes, DataType type,
                               Communicator& group, Allocator* device, AsyncCopier* copier)
    : collective_(collective), type_(type), group_(group), device_(device), copier_(copier) {
  const int ranks = group.size(), rank = group.rank();
  const bool per_rank = collective == "reduce_scatter" || collective == "all_gather" ||
                        collective == "all_to_all";
  const std::size_t element = size_of(type);
  range_ = type == DataType::float32 ? 64 : std::clamp(256 / ranks, 2, 64);
  count_ = static_cast<std::size_t>(bytes) / element / static_cast<std::size_t>(per_rank ? ranks : 1);
  const std::size_t whole = count_ * (per_rank ? ranks : 1);
  bytes_ = static_cast<std::int64_t>(whole * element);
  send_.resize((collective == "all_gather" ? count_ : whole) * element);
  receive_.resize((collective == "reduce_scatter" ? count_ : whole) * element);
  expected_.resize(receive_.size() / element);
  if (device_ != nullptr) {
    send_device_ = device_->allocate(MemoryState::comm_buffers, send_.size());
    receive_device_ = device_->allocate(MemoryState::comm_buffers, receive_.size());
  }
  if (is_device_copy(collective)) pinned_ = copier_->host_memory().allocate(MemoryState::comm_buffers, whole * element);
  const auto n = static_cast<std::size_t>(ranks);
  const auto r = static_cast<std::size_t>(rank);
  const auto of = [this](int source, std::size_t index) { return value(source, index, range_); };
  for (std::size_t index = 0; index < expected_.size(); ++index) {
    float sum = 0;
    if (collective == "all_reduce") {
      for (int source = 0; source < ranks; ++source) sum += of(source, index);
    } else if (collective == "reduce_scatter") {
      for (int source = 0; source < ranks; ++source) sum += of(source, r * count_ + index);
    } else if (collective == "all_gather") {
      sum = of(static_cast<int>(index / count_), index % count_);
    } else if (collective == "all_to_all") {  // block s came from rank s: its block for me
      sum = of(static_cast<int>(index / count_), r * count_ + index % count_);
    } else if (collective == "broadcast") {
      sum = of(0, index);
    } else if (is_device_copy(collective)) {
      sum = of(rank, index);
    } else {  // send_recv around the ring: from the previous rank
      sum = of(static_cast<int>((r + n - 1) % n), index);
    }
    expected_[index] = sum;
  }
}

void CollectiveCase::fill() {
  const int rank = group_.rank();
  for (std::size_t index = 0; index < send_.size() / size_of(type_); ++index)
    store_element(send_.data(), index, type_, value(rank, index, range_));
  for (std::size_t index = 0; index < expected_.size(); ++index) {
    const float initial = collective_ == "broadcast" && rank == 0 ? value(0, index, range_) : -1.0f;
    store_element(receive_.data(), index, type_, initial);
    if (!pinned_.empty())
      store_element(pinned_.as<void>(), index, type_, collective_ == "copy_to_device" ? value(rank, index, range_) : -1.0f);
  }
  if (device_ == nullptr) return;
  device_->copy_to_device(send_device_.as<void>(), send_.data(), send_.size());
  device_->copy_to_device(receive_device_.as<void>(), receive_.data(), receive_.size());
}

void CollectiveCase::run() {
  const int ranks = group_.size(), rank = group_.rank();
  void* send = device_ != nullptr ? send_device_.as<void>() : send_.data();
  void* receive = device_ != nullptr ? receive_device_.as<void>() : receive_.data();
  const auto operation = [&](CommOp op) {
    return Operation{.op = op, .send = send, .receive = receive, .count = count_, .type = type_};
  };
  if (collective_ == "copy_to_host") {
    copier_->start_to_host(0, pinned_.as<void>(), send, static_cast<std::size_t>(bytes_));
    copier_->wait_to_host(0);
  } else if (collective_ == "copy_to_device") {
    copier_->start_to_device(0, receive, pinned_.as<void>(), static_cast<std::size_t>(bytes_));
    copier_->wait_to_device(0);
  } else if (collective_ == "all_reduce" || collective_ == "reduce_scatter" || collective_ == "all_gather" ||
             collective_ == "all_to_all") {
    group_.run(operation(collective_ == "all_reduce"       ? CommOp::all_reduce
                         : collective_ == "reduce_scatter" ? CommOp::reduce_scatter
                         : collective_ == "all_gather"     ? CommOp::all_gather
                                                           : CommOp::all_to_all));
  } else if (collective_ == "broadcast") {
    Operation broadcast = operation(CommOp::broadcast);
    broadcast.send = nullptr;
    broadcast.count = expected_.size();
    group_.run(broadcast);
  } else {
    Operation received = operation(CommOp::recv), sent = operation(CommOp::send);
    received.send = nullptr;
    received.peer = (rank + ranks - 1) % ranks;
    sent.receive = nullptr;
    sent.peer = (rank + 1) % ranks;
    Request receiving = group_.start(received), sending = group_.start(sent);
    sending.wait();
    receiving.wait();
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
  for (std::size_t index = 0; index < expected_.size(); ++index)
    wrong += load_element(result, index, type_) != expected_[index];
  return wrong;
}

double CollectiveCase::bus_factor() const {
  const double n = group_.size();
  if (collective_ == "all_reduce") return 2 * (n - 1) / n;
  if (collective_ == "broadcast" || collective_ == "send_recv" || is_device_copy(collective_)) return 1;
  return (n - 1) / n;
}

}  // namespace mlptrain
