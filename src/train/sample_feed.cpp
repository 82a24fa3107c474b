// Reading micro-batches' samples, ahead where it pays (see sample_feed.hpp).
#include "train/sample_feed.hpp"

#include <cstring>
#include <span>

#include "core/error.hpp"

namespace mlptrain {

SampleFeed::SampleFeed(Dataset& dataset, Allocator& memory, SampleParts parts)
    : dataset_(dataset), memory_(memory) {
  const DatasetInfo& info = dataset.info();
  bytes_per_sample_ = {parts.inputs ? static_cast<std::size_t>(info.input_dim) * sizeof(float) : 0,
                       parts.targets ? static_cast<std::size_t>(info.output_dim) * sizeof(float) : 0,
                       parts.labels ? sizeof(std::int32_t) : 0};
  reads_nothing_ = bytes_per_sample_ == std::array<std::size_t, 3>{};
  reads_ahead_ = !reads_nothing_ && memory.device() != Device::cpu && dataset.readable_from_any_thread();
}

SampleFeed::~SampleFeed() {
  if (ahead_done_.valid()) ahead_done_.wait();
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

void SampleFeed::fill(Batch& batch) const {
  std::array<void*, 3> parts{};
  for (std::size_t part = 0; part < parts.size(); ++part) {
    if (bytes_per_sample_[part] == 0) continue;
    batch.parts[part].resize(bytes_per_sample_[part] * batch.indices.size());
    parts[part] = batch.parts[part].data();
  }
  batch.problem = fill(batch.split, batch.indices, parts);
}

void SampleFeed::wait_for_read_ahead() {
  if (ahead_done_.valid()) ahead_done_.get();
}

void SampleFeed::read(Split split, const std::vector<std::int64_t>& indices,
                      const std::array<Buffer*, 3>& destination) {
  if (reads_nothing_) return;  // a middle pipeline stage
  std::array<void*, 3> parts{};
  for (std::size_t part = 0; part < parts.size(); ++part)
    if (bytes_per_sample_[part] > 0 && destination[part] != nullptr && !destination[part]->empty())
      parts[part] = destination[part]->as<void>();
  if (memory_.device() == Device::cpu) {  // straight into the buffers
    const auto problem = fill(split, indices, parts);
    if (problem && !problem_) problem_ = problem;
    return;
  }
  wait_for_read_ahead();
  Batch batch;
  if (ahead_ && ahead_->split == split && ahead_->indices == indices) {
    batch = std::move(*ahead_);
    ahead_.reset();
  } else {
    batch = {.split = split, .indices = indices};
    fill(batch);
  }
  if (batch.problem && !problem_) problem_ = batch.problem;
  for (std::size_t part = 0; part < parts.size(); ++part)
    if (parts[part] != nullptr) memory_.copy_to_device(parts[part], batch.parts[part].data(), batch.parts[part].size());
}

void SampleFeed::read_ahead(Split split, std::vector<std::int64_t> indices) {
  if (!reads_ahead_) return;
  wait_for_read_ahead();
  ahead_ = Batch{.split = split, .indices = std::move(indices)};
  ahead_done_ = std::async(std::launch::async, [this] { fill(*ahead_); });
}

}  // namespace mlptrain
