// Reading micro-batches' samples on the host, ahead where it pays (see sample_feed.hpp).
#include "feed/sample_feed.hpp"

#include <algorithm>
#include <cstring>
#include <span>

#include "core/error.hpp"

namespace mlptrain {

SampleFeed::SampleFeed(Dataset& dataset, Allocator& memory, SampleParts parts, int reader_threads)
    : dataset_(dataset), memory_(memory) {
  const DatasetInfo& info = dataset.info();
  bytes_per_sample_ = {parts.inputs ? static_cast<std::size_t>(info.input_dim) * sizeof(float) : 0,
                       parts.targets ? static_cast<std::size_t>(info.output_dim) * sizeof(float) : 0,
                       parts.labels ? sizeof(std::int32_t) : 0};
  reads_nothing_ = bytes_per_sample_ == std::array<std::size_t, 3>{};
  const bool any_thread = dataset.readable_from_any_thread();
  reads_ahead_ = !reads_nothing_ && reader_threads > 0 && (any_thread || dataset.reads_from_file());
  reader_threads_ = reads_ahead_ && any_thread ? std::max(1, reader_threads) : 1;
  if (!reads_nothing_ && memory.device() != Device::cpu)
    copier_ = memory.make_async_copier(upload_slots * static_cast<int>(bytes_per_sample_.size()));
}

SampleFeed::~SampleFeed() {
  finish_reads();
  if (copier_)
    for (int lane = 0; lane < copier_->lanes(); ++lane) copier_->wait_to_device(lane);
}

void SampleFeed::finish_reads() {
  for (Pending& pending : ahead_) pending.read.wait();
}

std::optional<std::string> SampleFeed::fill(Split split, const std::vector<std::int64_t>& indices,
                                            const std::array<void*, 3>& parts) const {
  try {
    dataset_.read(split, std::span<const std::int64_t>(indices), static_cast<float*>(parts[0]),
                  static_cast<float*>(parts[1]), static_cast<std::int32_t*>(parts[2]));
    return std::nullopt;
  } catch (const Error& error) {
    // The step still runs on this rank: on zeros, not on whatever the buffers held (labels out
    // of range would index outside the logits).
    for (std::size_t part = 0; part < parts.size(); ++part)
      if (parts[part] != nullptr) std::memset(parts[part], 0, bytes_per_sample_[part] * indices.size());
    return std::string(error.what());
  }
}

void SampleFeed::fill(Batch& batch, const std::array<bool, 3>& wanted) const {
  std::array<void*, 3> parts{};
  for (std::size_t part = 0; part < parts.size(); ++part)
    if (!batch.parts[part].empty() && wanted[part]) parts[part] = batch.parts[part].as<void>();
  // Slices of at least a few samples each, so that small batches stay on one thread.
  constexpr std::size_t fewest_samples_a_thread = 16;
  const std::size_t count = batch.indices.size();
  const std::size_t threads =
      std::clamp<std::size_t>(count / fewest_samples_a_thread, 1, static_cast<std::size_t>(reader_threads_));
  if (threads == 1) {
    batch.problem = fill(batch.split, batch.indices, parts);
    return;
  }
  std::vector<std::future<std::optional<std::string>>> slices;
  for (std::size_t slice = 0; slice < threads; ++slice) {
    const std::size_t first = count * slice / threads, end = count * (slice + 1) / threads;
    std::array<void*, 3> slice_parts{};
    for (std::size_t part = 0; part < parts.size(); ++part)
      if (parts[part] != nullptr) slice_parts[part] = static_cast<std::byte*>(parts[part]) + bytes_per_sample_[part] * first;
    std::vector<std::int64_t> indices(batch.indices.begin() + first, batch.indices.begin() + end);
    slices.push_back(std::async(std::launch::async, [this, &batch, slice_parts, indices = std::move(indices)] {
      return fill(batch.split, indices, slice_parts);
    }));
  }
  // Every slice is waited for (they write into the batch); the first problem is the batch's,
  // and the whole batch is zeros then, as one read's would be.
  for (auto& slice : slices) {
    auto problem = slice.get();
    if (problem && !batch.problem) batch.problem = std::move(problem);
  }
  if (batch.problem)
    for (Buffer& part : batch.parts)
      if (!part.empty()) std::memset(part.as<void>(), 0, part.bytes());
}

void SampleFeed::deliver(const std::shared_ptr<Batch>& batch, const std::array<void*, 3>& destination) {
  if (!copier_) {
    for (std::size_t part = 0; part < destination.size(); ++part)
      if (destination[part] != nullptr)
        memory_.copy_to_device(destination[part], batch->parts[part].as<void>(), batch->parts[part].bytes());
    return;
  }
  // The slot's previous batch stays in its page-locked memory until its copies have ended.
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % upload_slots;
  const int parts = static_cast<int>(destination.size());
  for (int part = 0; part < parts; ++part) copier_->wait_to_device(slot * parts + part);
  uploading_[static_cast<std::size_t>(slot)] = batch;
  for (int part = 0; part < parts; ++part) {
    if (destination[static_cast<std::size_t>(part)] == nullptr) continue;
    const Buffer& source = batch->parts[static_cast<std::size_t>(part)];
    copier_->start_to_device(slot * parts + part, destination[static_cast<std::size_t>(part)], source.as<void>(),
                             source.bytes());
    copier_->order_device_after_to_device(slot * parts + part);
  }
}

void SampleFeed::read(Split split, const std::vector<std::int64_t>& indices,
                      const std::array<Buffer*, 3>& destination) {
  if (reads_nothing_) return;  // a middle pipeline stage
  std::array<void*, 3> parts{};
  for (std::size_t part = 0; part < parts.size(); ++part)
    if (bytes_per_sample_[part] > 0 && destination[part] != nullptr && !destination[part]->empty())
      parts[part] = destination[part]->as<void>();
  if (memory_.device() == Device::cpu && !reads_ahead_) {  // straight into the buffers
    const auto problem = fill(split, indices, parts);
    if (problem && !problem_) problem_ = problem;
    return;
  }
  const auto queued = std::find_if(ahead_.begin(), ahead_.end(), [&](const Pending& pending) {
    return pending.batch->split == split && pending.batch->indices == indices;
  });
  std::shared_ptr<Batch> batch;
  if (queued != ahead_.end()) {
    queued->read.wait();
    batch = queued->batch;
    ahead_.erase(ahead_.begin(), queued + 1);
  } else {  // only the parts asked for (a V's loss chunk reads the targets alone), once no read runs
    finish_reads();
    batch = std::make_shared<Batch>(Batch{.split = split, .indices = indices});
    for (std::size_t part = 0; part < parts.size(); ++part)
      if (parts[part] != nullptr)
        batch->parts[part] = host_memory().allocate(MemoryState::workspace, bytes_per_sample_[part] * indices.size());
    fill(*batch, {true, true, true});
  }
  if (batch->problem && !problem_) problem_ = batch->problem;
  deliver(batch, parts);
}

void SampleFeed::read_ahead(Split split, std::vector<std::int64_t> indices) {
  if (!reads_ahead_) return;
  auto batch = std::make_shared<Batch>(Batch{.split = split, .indices = std::move(indices)});
  for (std::size_t part = 0; part < batch->parts.size(); ++part)
    if (bytes_per_sample_[part] > 0)
      batch->parts[part] = host_memory().allocate(MemoryState::workspace, bytes_per_sample_[part] * batch->indices.size());
  // One batch read at a time, in order: a file's library takes one reader, and the batch's own
  // reader threads fill the cores the computation leaves.
  std::shared_future<void> previous = ahead_.empty() ? std::shared_future<void>() : ahead_.back().read;
  // The batch stays in the queue (the main thread's) until its read is waited for: the thread
  // only fills it, and never holds the last reference to its host memory.
  std::shared_future<void> read = std::async(std::launch::async, [this, filled = batch.get(), previous] {
    if (previous.valid()) previous.wait();
    fill(*filled, {true, true, true});
  }).share();
  ahead_.push_back({std::move(batch), std::move(read)});
}

}  // namespace mlptrain
