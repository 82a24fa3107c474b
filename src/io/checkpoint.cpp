// Checkpoint saving (see checkpoint.hpp): the slices this rank writes, copied to host memory and
// checksummed while the caller waits; the frame made by rank 0 through the HDF5 library; the bytes
// written by a background writer; the file published once every rank agrees they are durable.
#include "io/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "comm/consensus.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "io/checkpoint_file.hpp"
#include "io/checkpoint_exchange.hpp"
#include "io/checkpoint_layout.hpp"

namespace mlptrain {

namespace fs = std::filesystem;

namespace {

void remove_partial(const fs::path& temporary) {
  std::error_code ignored;  // gone already, or never made: nothing to clean up
  fs::remove(temporary, ignored);
}

}  // namespace

std::string checkpoint_file_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return name;
}

void prepare_checkpoint_directory(const std::string& directory) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error || !fs::is_directory(directory))
    throw UsageError("--checkpoint-dir: cannot create directory '" + directory + "'");
  const fs::path probe = fs::path(directory) / ".write-probe";
  {
    std::ofstream file(probe);
    if (!file) throw UsageError("--checkpoint-dir: directory '" + directory + "' is not writable");
  }
  fs::remove(probe, error);
}

std::vector<std::string> retire_checkpoints(const std::string& directory, int keep) {
  std::error_code error;
  std::string latest;
  std::ifstream(fs::path(directory) / "latest") >> latest;
  std::vector<std::string> steps;  // step_NNNNNNNN.h5: in name order, in step order
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == checkpoint_file_name(0).size() && name.starts_with("step_") && name.ends_with(".h5"))
      steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  std::vector<std::string> removed;
  const std::size_t kept = static_cast<std::size_t>(std::max(keep, 0));
  for (std::size_t index = 0; index + kept < steps.size(); ++index)
    if (steps[index] != latest && fs::remove(fs::path(directory) / steps[index], error)) removed.push_back(steps[index]);
  return removed;
}

float* CheckpointSaver::snapshot(std::size_t floats, Allocator& allocator) {
  if (allocator.device() == Device::cpu) {
    // The host's own memory: charged to the ledger as workspace (large blocks start on a page).
    if (charged_snapshot_.bytes() < floats * sizeof(float)) {
      charged_snapshot_ = Buffer();
      charged_snapshot_ = allocator.allocate_floats(MemoryState::workspace, floats);
    }
    return charged_snapshot_.floats();
  }
  // A device's ledger counts device memory only: plain host memory, page-aligned, in whole pages.
  if (floats > snapshot_floats_) {
    const std::size_t bytes = (floats * sizeof(float) + page_bytes - 1) / page_bytes * page_bytes;
    snapshot_.reset(static_cast<float*>(std::aligned_alloc(page_bytes, bytes)));
    if (!snapshot_) throw std::bad_alloc();
    snapshot_floats_ = bytes / sizeof(float);
  }
  return snapshot_.get();
}

CheckpointSaver::SnapshotLayout CheckpointSaver::snapshot_layout(const RegroupPlan& plan, bool copied) {
  // The written slices: the kept ones, then the domains (whose elements arrive from other ranks).
  // Part by part, each part's slices in order; a slice of a page or more sits where its offset
  // in a page is its offset in the file's pages (datasets start on a page), so that its whole
  // pages can be written around the page cache. Kept slices are copied only when `copied`.
  SnapshotLayout layout;
  const std::size_t kept = plan.kept.size();
  for (int part = 0; part < part_count; ++part)
    for (std::size_t index = 0; index < kept + plan.domains.size(); ++index) {
      const WrittenSlice& slice = index < kept ? plan.kept[index] : plan.domains[index - kept];
      if (!copied && index < kept) {
        layout.positions.push_back(0);
        continue;
      }
      if (slice.count >= floats_per_page) {
        const auto page = static_cast<std::size_t>(floats_per_page);
        const auto in_page = static_cast<std::size_t>(slice.offset) % page;
        layout.floats += (in_page + page - layout.floats % page) % page;
      }
      layout.positions.push_back(layout.floats);
      layout.floats += static_cast<std::size_t>(slice.count);
    }
  return layout;
}

std::vector<const float*> CheckpointSaver::host_sources(const RegroupPlan& plan, bool copied,
                                                       const CheckpointScope& scope) {
  const SnapshotLayout layout = snapshot_layout(plan, copied);
  wait_until_prepared();
  float* copy = nullptr;
  agree_or_throw(scope.world, [&] { copy = layout.floats > 0 ? snapshot(layout.floats, scope.allocator) : nullptr; });
  std::vector<const float*> sources;
  std::vector<float*> domain_data;
  const std::size_t kept = plan.kept.size();
  for (int part = 0; part < part_count; ++part)
    for (std::size_t index = 0; index < kept + plan.domains.size(); ++index) {
      float* at = copy + layout.positions[sources.size()];
      if (index >= kept) {
        domain_data.push_back(at);
      } else if (!copied) {
        sources.push_back(slice_data(plan.kept[index], part));
        continue;
      } else {
        const WrittenSlice& slice = plan.kept[index];
        scope.allocator.copy_any_to_host(at, slice_data(slice, part), static_cast<std::size_t>(slice.count) * sizeof(float));
      }
      sources.push_back(at);
    }
  agree_or_throw(scope.world, [&] { regroup(plan, scope.global_tensors, domain_data, regroup_buffers_, scope.allocator, scope.world); });
  return sources;
}

void CheckpointSaver::prepare(const StatePlacement& placement, const CheckpointScope& scope) {
  const RegroupPlan plan =
      plan_regroup(written_slices(placement, scope.global_tensors), scope.global_tensors, scope.world);
  const SnapshotLayout layout = snapshot_layout(plan, true);
  wait_until_prepared();
  float* copy = nullptr;
  agree_or_throw(scope.world, [&] { copy = layout.floats > 0 ? snapshot(layout.floats, scope.allocator) : nullptr; });
  std::size_t sent = 0, received = 0;
  for (const WrittenSlice& slice : plan.sent) sent += static_cast<std::size_t>(slice.count) * part_count;
  for (const WrittenSlice& slice : plan.domains) received += static_cast<std::size_t>(slice.count) * part_count;
  // Nothing reads this memory until the first save, which waits for the thread first.
  preparing_ = std::thread([this, copy, floats = layout.floats, sent, received] {
    for (std::size_t at = 0; at < floats; at += floats_per_page) copy[at] = 0;
    regroup_buffers_.send.resize(std::max(regroup_buffers_.send.size(), sent));
    regroup_buffers_.receive.resize(std::max(regroup_buffers_.receive.size(), received));
  });
}

void CheckpointSaver::wait_until_prepared() {
  if (preparing_.joinable()) preparing_.join();
}

CheckpointSaver::~CheckpointSaver() { wait_until_prepared(); }

void CheckpointSaver::start(const std::string& directory, const TrainingState& state,
                            const CheckpointDescription& description, const CheckpointScope& scope,
                            bool background) {
  if (in_flight()) throw std::logic_error("checkpoint: a save started while another was in flight");
  const double started_ms = now_ms();
  const RegroupPlan plan =
      plan_regroup(written_slices(state.placement, scope.global_tensors), scope.global_tensors, scope.world);
  // Training changes the state once this returns, and a device's memory is not the writer's to
  // read: then the writer reads a copy.
  const std::vector<const float*> sources =
      host_sources(plan, background || scope.allocator.device() != Device::cpu, scope);
  std::vector<WrittenSlice> slices = plan.kept;
  slices.insert(slices.end(), plan.domains.begin(), plan.domains.end());
  check_slices_cover(slices, scope.global_tensors, scope.world);

  const fs::path final_path = fs::path(directory) / checkpoint_file_name(state.step);
  const fs::path temporary = fs::path(directory) / ("." + checkpoint_file_name(state.step) + ".partial");
  std::vector<std::uint64_t> offsets(scope.global_tensors.size() * part_count);
  agree_or_throw(scope.world, [&] {
    if (scope.world.rank() != 0) return;
    try {
      offsets = create_checkpoint_file(temporary, state, description, scope.global_tensors);
    } catch (const std::exception&) {
      remove_partial(temporary);
      throw;
    }
  });
  scope.world.broadcast(offsets.data(), offsets.size(), 0);
  std::vector<FileWrite> writes;
  for (int part = 0; part < part_count; ++part)
    for (const WrittenSlice& slice : slices)
      writes.push_back({.file_offset = offsets[slice.tensor * part_count + part] + static_cast<std::uint64_t>(slice.offset) * sizeof(float),
                        .data = sources[writes.size()],
                        .bytes = static_cast<std::size_t>(slice.count) * sizeof(float)});
  // The checksums and the check that every number is finite read what the writes read (host
  // memory that stays unchanged until they end), so they are the writer's work too: the pause is
  // the copy.
  writer_.start(temporary.string(), coalesce_writes(std::move(writes)), background,
                [this, slices, sources, &allocator = scope.allocator] {
                  slice_checksums_ = slice_checksums(slices, sources, allocator);
                  non_finite_ = non_finite_elements(slices, sources);
                });

  std::uint64_t bytes = 0, rank_bytes = 0;
  for (const ParameterTensor& tensor : scope.global_tensors) bytes += tensor.count * sizeof(float) * part_count;
  for (const WrittenSlice& slice : slices) rank_bytes += static_cast<std::uint64_t>(slice.count) * sizeof(float) * part_count;
  InFlight& save = in_flight_.emplace();
  save.temporary = temporary;
  save.final_path = final_path;
  save.saved = {.file = final_path.string(), .step = state.step, .bytes = bytes, .rank_bytes = rank_bytes};
  save.slices = std::move(slices);
  save.global_tensors = scope.global_tensors;
  save.started_ms = started_ms;
  save.background = background;
  save.saved.paused_ms = now_ms() - started_ms;
}

SavedCheckpoint CheckpointSaver::finish(Communicator& world) {
  InFlight save = std::move(*in_flight_);
  in_flight_.reset();
  const std::optional<std::string> problem = writer_.wait();
  // A save that fails leaves nothing behind: rank 0 made the partial file, and removes it.
  const auto failed = [&] {
    if (world.rank() == 0) remove_partial(save.temporary);
  };
  try {
    agree_or_throw(world, [&] {
      if (problem) throw RuntimeFailure(*problem);
    });
  } catch (const AgreedError&) {
    failed();
    throw;
  }
  std::int64_t non_finite = non_finite_;
  world.all_reduce(&non_finite, 1, ReduceOp::sum);
  if (non_finite > 0) {
    failed();
    throw AgreedError(ExitCode::runtime_failure,
                      "step " + std::to_string(save.saved.step) + ": " + std::to_string(non_finite) +
                          " numbers of the parameters and optimizer state are not finite; no checkpoint written");
  }
  const std::vector<std::uint32_t> checksums =
      dataset_checksums(save.slices, slice_checksums_, save.global_tensors, world);
  agree_or_throw(world, [&] {
    if (world.rank() != 0) return;
    try {
      write_checkpoint_checksums(save.temporary, save.global_tensors, checksums);
      publish_checkpoint(save.temporary, save.final_path);
    } catch (const std::exception&) {
      failed();
      throw;
    }
  });
  // Until the last rank's writes were durable (the rename waits for a step boundary when async).
  double written_s = (writer_.ended_ms() - save.started_ms) / 1000.0;
  world.all_reduce(&written_s, 1, ReduceOp::max);
  save.saved.seconds = written_s;
  if (!save.background) save.saved.paused_ms = (now_ms() - save.started_ms);
  save.saved.write_start_ms = writer_.started_ms();
  save.saved.write_end_ms = writer_.ended_ms();
  return save.saved;
}

std::string save_checkpoint(const std::string& directory, const TrainingState& state,
                            const CheckpointDescription& description, const CheckpointScope& scope) {
  CheckpointSaver saver;
  saver.start(directory, state, description, scope, false);
  return saver.finish(scope.world).file;
}

}  // namespace mlptrain
