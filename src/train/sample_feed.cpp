// Reading micro-batches' samples, ahead where it pays (see sample_feed.hpp).
#include "train/sample_feed.hpp"

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
}

SampleFeed::~SampleFeed() {
  if (ahead_done_.valid()) ahead_done_.wait();
}

void SampleFeed::finish_reads() {
  if (ahead_done_.valid()) ahead_done_.get();
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
  for (std::size_t part = 0; part < parts.size(); ++part) {
    if (bytes_per_sample_[part] == 0 || !wanted[part]) continue;
    batch.parts[part].resize(bytes_per_sample_[part] * batch.indices.size());
    parts[part] = batch.parts[part].data();
  }
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
    for (auto& part : batch.parts) std::fill(part.begin(), part.end(), std::byte{0});
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
  finish_reads();
  Batch batch;
  if (ahead_ && ahead_->split == split && ahead_->indices == indices) {
    batch = std::move(*ahead_);
    ahead_.reset();
  } else {  // only the parts asked for (a V's loss chunk reads the targets alone)
    batch = {.split = split, .indices = indices};
    fill(batch, {parts[0] != nullptr, parts[1] != nullptr, parts[2] != nullptr});
  }
  if (batch.problem && !problem_) problem_ = batch.problem;
  for (std::size_t part = 0; part < parts.size(); ++part)
    if (parts[part] != nullptr) memory_.copy_to_device(parts[part], batch.parts[part].data(), batch.parts[part].size());
}

void SampleFeed::read_ahead(Split split, std::vector<std::int64_t> indices) {
  if (!reads_ahead_) return;
  finish_reads();
  ahead_ = Batch{.split = split, .indices = std::move(indices)};
  ahead_done_ = std::async(std::launch::async, [this] { fill(*ahead_, {true, true, true}); });
}

}  // namespace mlptrain
