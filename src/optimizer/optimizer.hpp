// AdamW exactly as torch.optim.AdamW (one parameter group), the learning-rate schedules of
// DESIGN.md §2.1, and the pieces of global-norm clipping: every rank sums the squares of the
// gradients it counts (each element is counted by one of its copies), the trainer sums those over
// the world.
// With --offload the moments live in host memory and the update runs there (ZeRO-Offload's
// split), overlapping the next forward (offloaded_update.hpp).
#pragma once

#include <cstdint>
#include <memory>

#include "core/buffer.hpp"
#include "core/config.hpp"
#include "device/compute_device.hpp"
#include "kernels/kernels.hpp"
#include "model/state_ranges.hpp"
#include "optimizer/offloaded_update.hpp"

namespace mlptrain {

// lr of the optimizer step with 0-based index `step`.
double scheduled_learning_rate(const Config& config, std::int64_t step);

// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: min(1, clip / (norm + 1e-6)).
double clip_coefficient(double max_norm, double total_norm);

// AdamW over the runs a rank updates: it owns their moments and, with a 16-bit param type, their
// fp32 master weights (laid out as the placement says, charged to the ledger as optimizer state),
// and points each run at its share of them. With an fp32 param type the values are the masters.
class AdamW {
 public:
  // The state in `device` memory, or with `offload` in its host memory (with host copies of the
  // gradients, and of the values or their rounded compute copy, charged there as workspace).
  AdamW(const Config& config, Allocator& device, StatePlacement& placement,
        HostSide* offload = nullptr);

  // Sum of squares of the counted runs' gradients (or values), as stored (a scaled loss's
  // gradients are scaled).
  enum class Field { grads, values };
  static double owned_square_sum(Kernels& kernels, const StatePlacement& placement,
                                 Field field = Field::grads);

  // One update of every run (the placement's updated runs) as optimizer step `step` (counting
  // from 1), with the gradients multiplied by `grad_scale` first (unscaling and clipping).
  // Returns the sum of squares of the counted gradients it read, so multiplied. Offloaded, the
  // values are in flux when it returns: see wait_for_layer and finish_update.
  double update(Kernels& kernels, const StatePlacement& placement, double learning_rate, std::int64_t step,
                float grad_scale = 1.0f);
  // The device's work queued from now on sees `layer`'s updated values.
  void wait_for_layer(int layer) {
    if (offloaded_) offloaded_->wait_for_layer(layer);
  }
  // How many pieces an offloaded update moves and updates one after the other (0: not offloaded).
  std::size_t offloaded_pieces() const { return offloaded_ ? offloaded_->pieces() : 0; }
  // Every updated value is in place.
  void finish_update() {
    if (offloaded_) offloaded_->finish();
  }

 private:
  const Config& config_;
  Buffer master_;  // with a 16-bit param type
  Buffer exp_avg_;
  Buffer exp_avg_sq_;
  Buffer host_values_, host_grads_;  // offloaded: indexed like the moments
  std::unique_ptr<OffloadedUpdate> offloaded_;
};

}  // namespace mlptrain
