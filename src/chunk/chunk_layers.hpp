// One model chunk's layers as its runner drives them: each layer's shape, its view into the
// parameter store (a Linear layer's tensors) or its MoE layer, and where its unit lies in the
// store; for each use of a layer, its tensors placed from wherever the hooks left its unit (a
// gathered copy of sharded parameters, a transient gradient buffer); and where a layer's input
// and output are in a micro-batch's activations.
#pragma once

#include <optional>
#include <vector>

#include "model/linear.hpp"
#include "model/micro_batch.hpp"
#include "model/moe.hpp"
#include "model/parameter_store.hpp"
#include "schedule/schedule.hpp"
#include "strategies/forward_views.hpp"

namespace mlptrain {

class ChunkLayers {
 public:
  ChunkLayers(const ParameterStore& parameters, const std::vector<LayerSpec>& specs, LayerRange chunk,
              const MoeSettings& moe);

  std::size_t size() const { return views_.size(); }
  // The model's index of local layer `local`, and whether the chunk starts or ends the model.
  int global(std::size_t local) const { return first_ + static_cast<int>(local); }
  bool starts_model() const { return first_ == 0; }
  bool ends_model() const { return last_ == model_layers_; }
  const LayerSpec& spec(std::size_t local) const { return views_[local].spec; }
  // The parameters' and activations' types, and the fp8 recipe, every layer's alike.
  const Precision& precision() const { return precision_; }
  std::vector<LayerSpec> specs() const;
  // An MoE layer's passes (none for a Linear layer).
  const std::optional<MoeLayer>& moe(std::size_t local) const { return moe_layers_[local]; }

  // The layer's unit in the store, its gradients written (the first micro-batch) or added.
  UnitMemory unit(std::size_t local, bool accumulate_grads) const;
  // A use's tensors in `unit`: a Linear layer's view, or an MoE layer's parameters.
  struct Placed {
    LinearLayer linear;
    MoeParameters moe;
  };
  Placed place(std::size_t local, const UnitMemory& unit) const;

  // In a micro-batch's activations: the rows layer `local` receives, the input it read in
  // forward (the micro-batch's, or the previous layer's output), and its output (GELU(pre), or pre).
  std::int64_t input_rows(const MicroBatchActivations& activations, std::size_t local) const {
    return local == 0 ? activations.rows : activations.output_rows[local - 1];
  }
  const void* input_of(MicroBatchActivations& activations, std::size_t local) const {
    return local == 0 ? activations.input.as<void>() : output_of(activations, local - 1);
  }
  void* output_of(MicroBatchActivations& activations, std::size_t local) const {
    return spec(local).gelu ? activations.output[local].as<void>() : activations.pre[local].as<void>();
  }

 private:
  // A layer's unit in the store, and a Linear layer's weight and bias in it (elements).
  struct StoreUnit {
    void* values = nullptr;
    void* grads = nullptr;
    std::size_t weight_at = 0;
    std::size_t bias_at = 0;
  };
  std::vector<LinearLayer> views_;  // a Linear layer's into the store; an MoE layer's shape alone
  std::vector<std::optional<MoeLayer>> moe_layers_;
  std::vector<StoreUnit> units_;
  Precision precision_;
  int first_ = 0;
  int last_ = 0;
  int model_layers_ = 0;
};

}  // namespace mlptrain
