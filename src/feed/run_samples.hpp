// The samples of a run on this rank: the dataset, the loss its targets imply, the order samples
// are read in, the batch layout (which samples a step's micro-batches take on this rank), and the
// feed that reads them into a micro-batch's buffers, rounded to the param type where the model
// starts. The loop asks it for a micro-batch's samples and never sees the reading itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "data/dataset.hpp"
#include "data/sample_order.hpp"
#include "kernels/kernels.hpp"
#include "model/loss.hpp"
#include "model/micro_batch.hpp"
#include "feed/sample_source.hpp"

namespace mlptrain {

class RunSamples {
 public:
  // What the rank's model needs of the samples: inputs where it starts, targets or labels where
  // it computes the loss, in its activations' type.
  struct ModelSide {
    bool reads_inputs = false;
    bool computes_loss = false;
    DataType activation_type = DataType::float32;
  };
  RunSamples(const Config& config, std::unique_ptr<Dataset> dataset, Kernels& kernels, Allocator& memory,
          ModelSide model, int data_rank, int reader_threads);

  const DatasetInfo& info() const { return dataset_->info(); }
  LossKind loss_kind() const { return loss_kind_; }
  // Where a resumed run continues; the checkpoint sets and stores it.
  BatchLayout& batch() { return batch_; }
  const BatchLayout& batch() const { return batch_; }

  // Reads training micro-batch `micro_batch` of step `step` into `activations` (its inputs only
  // with `inputs`) and, at the rank's first read of it, keeps the micro-batches after it read
  // ahead, as many as the source reads ahead (across steps, up to the run's end).
  void read_training(std::int64_t step, int micro_batch, MicroBatchActivations& activations, bool inputs);
  // Reads the samples `indices` of `split` into `activations` (their inputs only with `inputs`:
  // a chunk that computes the loss without starting the model takes the targets or labels).
  void read(Split split, const std::vector<std::int64_t>& indices, MicroBatchActivations& activations, bool inputs);
  // Waits for the samples being read ahead: before the caller uses the HDF5 library itself.
  void finish_reads() { source_->finish_reads(); }
  // Milliseconds the training reads waited for samples since the last call (reading them, or
  // waiting for the read ahead to finish), and a fresh count from here.
  double take_wait_ms() { return std::exchange(wait_ms_, 0.0); }
  // The first read problem met (a read that failed gave zeros), for every rank to agree on.
  const std::optional<std::string>& problem() const { return source_->problem(); }

 private:
  std::vector<std::int64_t> training_samples(std::int64_t step, int micro_batch) const {
    return order_->samples(batch_.first_position(step, micro_batch, data_rank_), batch_.local_size());
  }
  // Built-in data on a device is generated there; anything else is read on the host.
  std::unique_ptr<SampleSource> make_source(SampleParts parts, int reader_threads) const;

  std::unique_ptr<Dataset> dataset_;
  Kernels& kernels_;
  Allocator& memory_;
  const ModelSide model_;
  const int data_rank_;
  const std::int64_t steps_;
  LossKind loss_kind_ = LossKind::mse;
  double wait_ms_ = 0;
  BatchLayout batch_;
  std::unique_ptr<SampleOrder> order_;
  std::unique_ptr<SampleSource> source_;
  std::int64_t read_ahead_until_ = -1;  // the last training micro-batch (step x M + j) asked ahead
};

}  // namespace mlptrain
