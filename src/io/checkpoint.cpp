// Checkpoint saving (see checkpoint.hpp): the slices this rank writes, copied to host memory and
// checksummed while the caller waits; the frame made by rank 0 through the HDF5 library; the bytes
// written by a background writer; the file published once every rank agrees they are durable.
#include "io/checkpoint.hpp"

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

std::vector<const float*> CheckpointSaver::host_sources(const RegroupPlan& plan, bool copied,
                                                       const CheckpointScope& scope) {
  // The written slices: the kept ones, then the domains (whose elements arrive from other ranks).
  std::vector<WrittenSlice> written = plan.kept;
  written.insert(written.end(), plan.domains.begin(), plan.domains.end());
  // Part by part, each part's slices in order; a slice of a page or more sits where its offset
  // in a page is its offset in the file's pages (datasets start on a page), so that its whole
  // pages can be written around the page cache. Kept slices are copied only when `copied`.
  std::vector<std::size_t> positions;
  std::size_t floats = 0;
  for (int part = 0; part < part_count; ++part)
    for (std::size_t index = 0; index < written.size(); ++index) {
      const WrittenSlice& slice = written[index];
      if (!copied && index < plan.kept.size()) {
        positions.push_back(0);
        continue;
      }
      if (slice.count >= floats_per_page) {
        const auto page = static_cast<std::size_t>(floats_per_page);
        const auto in_page = static_cast<std::size_t>(slice.offset) % page;
        floats += (in_page + page - floats % page) % page;
      }
      positions.push_back(floats);
      floats += static_cast<std::size_t>(slice.count);
    }
  float* copy = nullptr;
  agree_or_throw(scope.world, [&] { copy = floats > 0 ? snapshot(floats, scope.allocator) : nullptr; });
  std::vector<const float*> sources;
  std::vector<float*> domain_data;
  for (int part = 0; part < part_count; ++part)
    for (std::size_t index = 0; index < written.size(); ++index) {
      const WrittenSlice& slice = written[index];
      float* at = copy + positions[sources.size()];
      if (index >= plan.kept.size()) {
        domain_data.push_back(at);
      } else if (!copied) {
        sources.push_back(slice_data(slice, part));
        continue;
      } else {
        scope.allocator.copy_any_to_host(at, slice_data(slice, part), static_cast<std::size_t>(slice.count) * sizeof(float));
      }
      sources.push_back(at);
    }
  agree_or_throw(scope.world, [&] { regroup(plan, scope.global_tensors, domain_data, regroup_buffers_, scope.allocator, scope.world); });
  return sources;
}

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
  const std::vector<std::uint32_t> checksums =
      dataset_checksums(slices, slice_checksums(slices, sources, scope.allocator), scope.global_tensors, scope.world);

  const fs::path final_path = fs::path(directory) / checkpoint_file_name(state.step);
  const fs::path temporary = fs::path(directory) / ("." + checkpoint_file_name(state.step) + ".partial");
  std::vector<std::uint64_t> offsets(scope.global_tensors.size() * part_count);
  agree_or_throw(scope.world, [&] {
    if (scope.world.rank() == 0)
      offsets = create_checkpoint_file(temporary, state, description, scope.global_tensors, checksums);
  });
  scope.world.broadcast(offsets.data(), offsets.size(), 0);
  std::vector<FileWrite> writes;
  for (int part = 0; part < part_count; ++part)
    for (const WrittenSlice& slice : slices)
      writes.push_back({.file_offset = offsets[slice.tensor * part_count + part] + static_cast<std::uint64_t>(slice.offset) * sizeof(float),
                        .data = sources[writes.size()],
                        .bytes = static_cast<std::size_t>(slice.count) * sizeof(float)});
  writer_.start(temporary.string(), coalesce_writes(std::move(writes)), background);

  std::uint64_t bytes = 0, rank_bytes = 0;
  for (const ParameterTensor& tensor : scope.global_tensors) bytes += tensor.count * sizeof(float) * part_count;
  for (const WrittenSlice& slice : slices) rank_bytes += static_cast<std::uint64_t>(slice.count) * sizeof(float) * part_count;
  in_flight_ = InFlight{.temporary = temporary,
                        .final_path = final_path,
                        .saved = {.file = final_path.string(), .step = state.step, .bytes = bytes, .rank_bytes = rank_bytes},
                        .started_ms = started_ms,
                        .background = background};
  in_flight_->saved.paused_ms = now_ms() - started_ms;
}

SavedCheckpoint CheckpointSaver::finish(Communicator& world) {
  InFlight save = std::move(*in_flight_);
  in_flight_.reset();
  const std::optional<std::string> problem = writer_.wait();
  agree_or_throw(world, [&] {
    if (problem) throw RuntimeFailure(*problem);
  });
  agree_or_throw(world, [&] {
    if (world.rank() == 0) publish_checkpoint(save.temporary, save.final_path);
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
