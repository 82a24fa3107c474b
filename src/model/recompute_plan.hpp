// Which activations a forward keeps for its backward, over a rank's local layers. Without
// recomputation every layer keeps its input and pre-activation. With it, the local layers form
// segments of about sqrt(n / 2) layers: forward keeps each segment's input (and the stage's
// output) and drops the GELU layers' pre-activations, and backward recomputes a segment before
// going through it, so a micro-batch holds about 2 sqrt(2n) layer outputs instead of 2n. An MoE
// layer is never recomputed (its routing would exchange and count again): its output stays as
// the next layer's input. The runner follows this plan and the cost model predicts from it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "model/model_spec.hpp"

namespace mlptrain {

class RecomputePlan {
 public:
  RecomputePlan(const std::vector<LayerSpec>& local_layers, bool recompute) : recompute_(recompute) {
    // Segments of k layers keep n / k inputs and recompute 2 k activations at a time: k about
    // sqrt(n / 2) makes the sum smallest.
    const auto count = static_cast<double>(local_layers.size());
    segment_length_ = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(std::sqrt(count / 2))));
    for (const LayerSpec& layer : local_layers) {
      gelu_.push_back(layer.gelu);
      moe_.push_back(layer.moe());
    }
  }

  bool recomputes() const { return recompute_; }
  std::size_t layer_count() const { return gelu_.size(); }
  // Local layers per recomputed segment (0 without recomputation).
  std::size_t segment_length() const { return recompute_ ? segment_length_ : 0; }
  // Forward keeps layer `local`'s pre-activation for backward (else backward recomputes it);
  // evaluation keeps nothing.
  bool keeps_pre(std::size_t local, bool training) const {
    return training && (!recompute_ || !gelu_[local]);
  }
  // Forward keeps layer `local`'s input (the previous layer's output) for backward.
  bool keeps_input(std::size_t local, bool training) const {
    return local == 0 || (training && (!recompute_ || local % segment_length_ == 0 || moe_[local - 1]));
  }
  // Backward recomputes the segment that ends at `local` before going through it.
  bool ends_segment(std::size_t local) const {
    return recompute_ && (local + 1 == gelu_.size() || (local + 1) % segment_length_ == 0);
  }
  std::size_t segment_start(std::size_t local) const { return local - local % segment_length_; }

 private:
  bool recompute_ = false;
  std::size_t segment_length_ = 1;
  std::vector<bool> gelu_;
  std::vector<bool> moe_;
};

}  // namespace mlptrain
