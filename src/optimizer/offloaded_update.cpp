// The pipelined offloaded AdamW update (see offloaded_update.hpp).
#include "optimizer/offloaded_update.hpp"

#include <algorithm>
#include <stdexcept>

namespace mlptrain {

namespace {

int values_lane(std::size_t piece) { return static_cast<int>(2 * piece); }
int grads_lane(std::size_t piece) { return static_cast<int>(2 * piece + 1); }

}  // namespace

std::vector<OffloadedUpdate::Piece> OffloadedUpdate::layer_pieces(const std::vector<StateRange>& runs,
                                                                   const Precision& precision) {
  std::vector<Piece> pieces;
  for (const StateRange& run : runs) {
    const auto count = static_cast<std::size_t>(run.count);
    if (count == 0) continue;
    const int layer = run.tensor != nullptr ? run.tensor->layer : 0;
    if (!pieces.empty()) {
      Piece& last = pieces.back();
      if (last.layer == layer && advance(last.values, last.count, precision.param) == run.values &&
          advance(last.grads, last.count, precision.reduce) == run.grads &&
          last.moment_offset + last.count == run.moment_offset) {
        last.count += count;
        continue;
      }
    }
    pieces.push_back({run.values, run.grads, run.moment_offset, count, layer});
  }
  // Forward order: the next forward reads the first layer first.
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.layer < b.layer; });
  return pieces;
}

OffloadedUpdate::OffloadedUpdate(Allocator& device, Kernels& host_kernels, const std::vector<StateRange>& runs,
                                 const HostState& host)
    : host_kernels_(host_kernels), host_(host), pieces_(layer_pieces(runs, host.precision)) {
  copier_ = device.make_async_copier(static_cast<int>(std::max<std::size_t>(2 * pieces_.size(), 1)));
  if (!copier_) throw std::logic_error("offloading needs a device with background copies");
}

OffloadedUpdate::~OffloadedUpdate() {
  try {
    finish();
  } catch (...) {
    // Already failing: the error that ends the run is reported elsewhere.
  }
}

void* OffloadedUpdate::host_values(std::size_t at) const {
  return host_.compute_copy != nullptr ? advance(host_.compute_copy, at, host_.precision.param)
                                       : static_cast<void*>(host_.master + at);
}

void OffloadedUpdate::start(const AdamWStep& settings) {
  finish();
  const Precision& precision = host_.precision;
  // fp32 values are the masters and come down; a 16-bit compute copy is only ever sent up.
  const bool values_down = !precision.keeps_master();
  for (std::size_t index = 0; index < pieces_.size(); ++index) {
    const Piece& piece = pieces_[index];
    const std::size_t at = piece.moment_offset;
    if (values_down)
      copier_->start_to_host(values_lane(index), host_.master + at, piece.values, piece.count * sizeof(float));
    copier_->start_to_host(grads_lane(index), advance(host_.grads, at, precision.reduce), piece.grads,
                           piece.count * precision.reduce_bytes());
  }
  for (std::size_t index = 0; index < pieces_.size(); ++index) {
    if (values_down) copier_->wait_to_host(values_lane(index));
    copier_->wait_to_host(grads_lane(index));
  }
  {
    const std::lock_guard lock(mutex_);
    sent_ = 0;
    failed_ = false;
  }
  waited_layers_.clear();
  worker_ = std::async(std::launch::async, [this, settings] { update_pieces(settings); });
}

void OffloadedUpdate::update_pieces(AdamWStep settings) {
  try {
    for (std::size_t index = 0; index < pieces_.size(); ++index) {
      const Piece& piece = pieces_[index];
      const std::size_t at = piece.moment_offset;
      const Precision& precision = host_.precision;
      host_kernels_.adamw(host_.master + at, advance(host_.grads, at, precision.reduce), precision.reduce,
                          host_.exp_avg + at, host_.exp_avg_sq + at, piece.count, settings,
                          host_.compute_copy != nullptr ? host_values(at) : nullptr, precision.param);
      copier_->start_to_device(values_lane(index), piece.values, host_values(at),
                               piece.count * precision.param_bytes());
      const std::lock_guard lock(mutex_);
      sent_ = index + 1;
      progress_.notify_all();
    }
  } catch (...) {
    const std::lock_guard lock(mutex_);
    failed_ = true;
    progress_.notify_all();
    throw;
  }
}

void OffloadedUpdate::wait_for_layer(int layer) {
  if (!worker_.valid() ||
      std::find(waited_layers_.begin(), waited_layers_.end(), layer) != waited_layers_.end())
    return;
  for (std::size_t index = 0; index < pieces_.size(); ++index) {
    if (pieces_[index].layer != layer) continue;
    bool failed = false;
    {
      std::unique_lock lock(mutex_);
      progress_.wait(lock, [&] { return sent_ > index || failed_; });
      failed = failed_;
    }
    if (failed) finish();  // rethrows the host thread's error
    copier_->order_device_after_to_device(values_lane(index));
  }
  waited_layers_.push_back(layer);
}

void OffloadedUpdate::finish() {
  if (!worker_.valid()) return;
  std::future<void> worker = std::move(worker_);
  worker.wait();
  std::size_t sent = 0;
  {
    const std::lock_guard lock(mutex_);
    sent = sent_;
  }
  for (std::size_t index = 0; index < sent; ++index) copier_->wait_to_device(values_lane(index));
  worker.get();
}

}  // namespace mlptrain
