// One rank's place in a layout, as plain data: the configuration, the whole model, the grid and
// this rank's coordinates in it, the layers it runs, its parameter tensors as the strategies'
// plan places them, the rows of a micro-batch it computes and one training step's actions. It is
// what the cost model and the strategies' descriptions read: nothing allocated, no communicator,
// so it can be made for a layout that is never launched.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "core/process_grid.hpp"
#include "model/loss.hpp"
#include "model/model_spec.hpp"
#include "model/parameter_store.hpp"
#include "schedule/schedule.hpp"

namespace mlptrain {

struct RankLayout {
  const Config& config;
  const std::vector<LayerSpec>& model;
  GridShape shape;
  GridCoordinates place;
  RankLayers layers;
  ParameterPlan plan;
  std::vector<ParameterTensor> tensors;  // this rank's, in the store's order and offsets
  std::int64_t rows = 0;                 // samples of a micro-batch on this rank
  LossKind loss_kind = LossKind::mse;
  std::vector<Action> schedule;          // one training step's actions on this rank
  std::vector<std::int64_t> output_rows; // per local layer: the rows of its outputs (empty: rows)

  int local_layer_count() const { return layers.count(); }
  std::int64_t layer_output_rows(std::size_t local) const {
    return local < output_rows.size() ? output_rows[local] : rows;
  }
  // The local shape of a layer of this rank (its tensors' slices): in/out as this rank computes.
  LayerSpec local_spec(int layer) const;
  // Elements of the store's padded layout (what it holds of values and of gradients).
  std::size_t store_size() const;
};

}  // namespace mlptrain
