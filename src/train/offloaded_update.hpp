// The AdamW update with the optimizer state in host memory (--offload, ZeRO-Offload's split),
// pipelined so that it overlaps the next step's forward. Each step the values and gradients of
// every piece of the rank's state (a layer's contiguous runs) come down to the host together;
// then a host thread updates the pieces in forward order and sends each one's values back up as
// soon as it is done, while the next forward waits, layer by layer, only for the pieces it reads.
// Numerics are those of the synchronous update: every element gets the same AdamW arithmetic.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/state_runs.hpp"

namespace mlptrain {

class OffloadedUpdate {
 public:
  // Pieces of `runs` (whose moments sit in `exp_avg` / `exp_avg_sq` at their moment offsets) with
  // host copies of their values and gradients in `host_values` / `host_grads`, indexed alike.
  // `host_kernels` run on the host thread; `device` is where the runs' values and gradients live.
  OffloadedUpdate(Allocator& device, Kernels& host_kernels, const std::vector<StateRun>& runs,
                  float* host_values, float* host_grads, float* exp_avg, float* exp_avg_sq);
  ~OffloadedUpdate();  // waits for an update in flight, whatever happened meanwhile
  OffloadedUpdate(const OffloadedUpdate&) = delete;
  OffloadedUpdate& operator=(const OffloadedUpdate&) = delete;

  // Takes the runs' values and gradients down (they must be final), then updates them on the host
  // thread and returns: the device may compute meanwhile but must not write the values, and may
  // read a layer's values only after wait_for_layer. The gradients are free again at once.
  void start(const AdamWStep& settings);
  // The device's work queued from now on sees `layer`'s updated values (the host waits only for
  // the host thread to have sent them).
  void wait_for_layer(int layer);
  // Every value is back on the device; rethrows what the host thread threw.
  void finish();

  std::size_t pieces() const { return pieces_.size(); }

 private:
  struct Piece {
    float* values;  // on the device; gradients and host copies follow the same offsets
    float* grads;
    std::size_t moment_offset;
    std::size_t count;
    int layer;
  };
  // Runs of one layer that follow each other in values, gradients and moments at once, merged
  // (what one copy each way moves: usually a layer's weight and bias), in forward order.
  static std::vector<Piece> layer_pieces(const std::vector<StateRun>& runs);
  void update_pieces(AdamWStep settings);  // the host thread

  Kernels& host_kernels_;
  float* host_values_;
  float* host_grads_;
  float* exp_avg_;
  float* exp_avg_sq_;
  std::vector<Piece> pieces_;  // in forward order
  std::unique_ptr<AsyncCopier> copier_;  // lane 2i: piece i's values, lane 2i + 1: its gradients

  std::mutex mutex_;
  std::condition_variable progress_;
  std::size_t sent_ = 0;  // pieces whose values are on their way up
  bool failed_ = false;
  std::future<void> worker_;
  std::vector<int> waited_layers_;  // the layers the device already waits for this step
};

}  // namespace mlptrain
