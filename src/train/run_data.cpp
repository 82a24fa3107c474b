// Reading a run's samples (see run_data.hpp).
#include "train/run_data.hpp"

#include "core/timer.hpp"

namespace mlptrain {

RunData::RunData(const Config& config, std::unique_ptr<Dataset> dataset, Kernels& kernels, Allocator& memory,
                 ModelSide model, int data_rank, int reader_threads)
    : dataset_(std::move(dataset)),
      kernels_(kernels),
      memory_(memory),
      model_(model),
      data_rank_(data_rank),
      steps_(config.steps),
      loss_kind_(dataset_->info().kind == TargetKind::classification ? LossKind::cross_entropy : LossKind::mse),
      batch_{.global_batch = config.global_batch, .micro_batches = config.micro_batches, .data_parallel = config.dp},
      order_(std::make_unique<SampleOrder>(dataset_->info().train_size, config.shuffle,
                                           static_cast<std::uint64_t>(config.seed))),
      feed_(std::make_unique<SampleFeed>(
          *dataset_, memory,
          SampleParts{.inputs = model.reads_inputs,
                      .targets = model.computes_loss && loss_kind_ == LossKind::mse,
                      .labels = model.computes_loss && loss_kind_ == LossKind::cross_entropy},
          reader_threads)) {}

void RunData::read_training(std::int64_t step, int micro_batch, MicroBatchActivations& activations, bool inputs) {
  const double start_ms = now_ms();
  read(Split::train, training_samples(step, micro_batch), activations, inputs);
  wait_ms_ += now_ms() - start_ms;
  // The next micro-batch's samples, read while the device computes this one; once (a rank that
  // reads the inputs reads the targets of the same micro-batch after them).
  const bool last = micro_batch + 1 == batch_.micro_batches;
  const bool first_read = inputs || !model_.reads_inputs;
  if (first_read && feed_->reads_ahead() && (!last || step + 1 < steps_))
    feed_->read_ahead(Split::train, training_samples(last ? step + 1 : step, last ? 0 : micro_batch + 1));
}

// Samples are read as fp32 and rounded to the param type before the first layer.
void RunData::read(Split split, const std::vector<std::int64_t>& indices, MicroBatchActivations& activations,
                   bool inputs) {
  const DataType type = model_.activation_type;
  if (type == DataType::float32 || !model_.reads_inputs || !inputs) {
    feed_->read(split, indices, {inputs ? &activations.input : nullptr, &activations.targets, &activations.labels});
    return;
  }
  const std::size_t count = activations.input.bytes() / size_of(type);
  Buffer samples = memory_.allocate_floats(MemoryState::workspace, count);
  feed_->read(split, indices, {&samples, &activations.targets, &activations.labels});
  kernels_.convert(samples.floats(), DataType::float32, activations.input.as<void>(), type, count);
}

}  // namespace mlptrain
