// The AdamW update with the optimizer state in host memory (--offload, ZeRO-Offload's split),
// pipelined so that it overlaps the next step's forward. Each step the gradients of every piece
// of the rank's state (a layer's contiguous runs) come down to the host together, with the values
// when they are the fp32 masters (a 16-bit param type keeps its masters on the host); then a host
// thread updates the pieces in forward order and sends each one's values (or their rounded
// compute copy) back up as soon as it is done, while the next forward waits, layer by layer, only
// for the pieces it reads. Numerics are those of the synchronous update: every element gets the
// same AdamW arithmetic.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"
#include "model/state_ranges.hpp"

namespace mlptrain {

class OffloadedUpdate {
 public:
  // The host's buffers, indexed like the moments (at the runs' moment offsets).
  struct HostState {
    float* master = nullptr;        // fp32: the host copy of the values; else the masters
    void* compute_copy = nullptr;   // a 16-bit param type: the rounded masters going up
    void* grads = nullptr;          // of the reduce type
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    Precision precision;
  };
  // Pieces of `runs` updated in `host`'s buffers by `host_kernels` on the host thread; `device` is
  // where the runs' values and gradients live.
  OffloadedUpdate(Allocator& device, Kernels& host_kernels, const std::vector<StateRange>& runs,
                  const HostState& host);
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
    void* values;  // on the device; gradients and host copies follow the same offsets
    void* grads;
    std::size_t moment_offset;
    std::size_t count;
    int layer;
  };
  // Runs of one layer that follow each other in values, gradients and moments at once, merged
  // (what one copy each way moves: usually a layer's weight and bias), in forward order.
  static std::vector<Piece> layer_pieces(const std::vector<StateRange>& runs, const Precision& precision);
  void update_pieces(AdamWStep settings);  // the host thread
  // The host's copy of what goes up to the device's values.
  void* host_values(std::size_t at) const;

  Kernels& host_kernels_;
  HostState host_;
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
