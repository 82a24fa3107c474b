// The pipelined offloaded AdamW update (see offloaded_update.hpp).
#include "train/offloaded_update.hpp"

#include <algorithm>
#include <stdexcept>

namespace mlptrain {

namespace {

int values_lane(std::size_t piece) { return static_cast<int>(2 * piece); }
int grads_lane(std::size_t piece) { return static_cast<int>(2 * piece + 1); }

}  // namespace

std::vector<OffloadedUpdate::Piece> OffloadedUpdate::layer_pieces(const std::vector<StateRun>& runs) {
  std::vector<Piece> pieces;
  for (const StateRun& run : runs) {
    const auto count = static_cast<std::size_t>(run.count);
    if (count == 0) continue;
    const int layer = run.tensor != nullptr ? run.tensor->layer : 0;
    if (!pieces.empty()) {
      Piece& last = pieces.back();
      if (last.layer == layer && last.values + last.count == run.values &&
          last.grads + last.count == run.grads && last.moment_offset + last.count == run.moment_offset) {
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

OffloadedUpdate::OffloadedUpdate(Allocator& device, Kernels& host_kernels,
                                 const std::vector<StateRun>& runs, float* host_values,
                                 float* host_grads, float* exp_avg, float* exp_avg_sq)
    : host_kernels_(host_kernels),
      host_values_(host_values),
      host_grads_(host_grads),
      exp_avg_(exp_avg),
      exp_avg_sq_(exp_avg_sq),
      pieces_(layer_pieces(runs)) {
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

void OffloadedUpdate::start(const AdamWStep& settings) {
  finish();
  for (std::size_t index = 0; index < pieces_.size(); ++index) {
    const Piece& piece = pieces_[index];
    const std::size_t bytes = piece.count * sizeof(float);
    copier_->start_to_host(values_lane(index), host_values_ + piece.moment_offset, piece.values, bytes);
    copier_->start_to_host(grads_lane(index), host_grads_ + piece.moment_offset, piece.grads, bytes);
  }
  for (std::size_t index = 0; index < pieces_.size(); ++index) {
    copier_->wait_to_host(values_lane(index));
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
      host_kernels_.adamw(host_values_ + at, host_grads_ + at, exp_avg_ + at, exp_avg_sq_ + at,
                          piece.count, settings);
      copier_->start_to_device(values_lane(index), piece.values, host_values_ + at,
                               piece.count * sizeof(float));
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
