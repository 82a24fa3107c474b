// Reading a run's samples (see run_samples.hpp).
#include "feed/run_samples.hpp"

#include <algorithm>

#include "core/timer.hpp"
#include "feed/device_samples.hpp"
#include "feed/sample_feed.hpp"

namespace mlptrain {

RunSamples::RunSamples(const Config& config, std::unique_ptr<Dataset> dataset, Kernels& kernels, Allocator& memory,
                 ModelSide model, int data_rank, int reader_threads)
    : dataset_(std::move(dataset)),
      kernels_(kernels),
      memory_(memory),
      model_(model),
      data_rank_(data_rank),
      steps_(config.training.steps),
      loss_kind_(dataset_->info().kind == TargetKind::classification ? LossKind::cross_entropy : LossKind::mse),
      batch_{.global_batch = config.data.global_batch, .micro_batches = config.data.micro_batches, .data_parallel = config.grid.dp},
      order_(std::make_unique<SampleOrder>(dataset_->info().train_size, config.data.shuffle,
                                           static_cast<std::uint64_t>(config.training.seed))),
      source_(make_source({.inputs = model.reads_inputs,
                           .targets = model.computes_loss && loss_kind_ == LossKind::mse,
                           .labels = model.computes_loss && loss_kind_ == LossKind::cross_entropy},
                          reader_threads)) {}

std::unique_ptr<SampleSource> RunSamples::make_source(SampleParts parts, int reader_threads) const {
  if (memory_.device() != Device::cpu)
    if (const auto samples = dataset_->synthetic()) return std::make_unique<DeviceSamples>(*samples, kernels_, memory_, parts);
  return std::make_unique<SampleFeed>(*dataset_, memory_, parts, reader_threads);
}

void RunSamples::read_training(std::int64_t step, int micro_batch, MicroBatchActivations& activations, bool inputs) {
  const double start_ms = now_ms();
  read(Split::train, training_samples(step, micro_batch), activations, inputs);
  wait_ms_ += now_ms() - start_ms;
  // The next micro-batches' samples, read while the device computes this one; once (a rank that
  // reads the inputs reads the targets of the same micro-batch after them).
  const bool first_read = inputs || !model_.reads_inputs;
  if (!first_read || source_->batches_ahead() == 0) return;
  const std::int64_t per_step = batch_.micro_batches, position = step * per_step + micro_batch;
  const std::int64_t last = std::min(position + source_->batches_ahead(), steps_ * per_step - 1);
  for (std::int64_t ahead = std::max(position, read_ahead_until_) + 1; ahead <= last; ++ahead)
    source_->read_ahead(Split::train, training_samples(ahead / per_step, static_cast<int>(ahead % per_step)));
  read_ahead_until_ = std::max(read_ahead_until_, last);
}

// Samples are read as fp32 and rounded to the param type before the first layer.
void RunSamples::read(Split split, const std::vector<std::int64_t>& indices, MicroBatchActivations& activations,
                   bool inputs) {
  const DataType type = model_.activation_type;
  if (type == DataType::float32 || !model_.reads_inputs || !inputs) {
    source_->read(split, indices, {inputs ? &activations.input : nullptr, &activations.targets, &activations.labels});
    return;
  }
  const std::size_t count = activations.input.bytes() / size_of(type);
  Buffer samples = memory_.allocate_floats(MemoryState::workspace, count);
  source_->read(split, indices, {&samples, &activations.targets, &activations.labels});
  kernels_.convert(samples.floats(), DataType::float32, activations.input.as<void>(), type, count);
}

}  // namespace mlptrain
