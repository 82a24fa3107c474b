// Consolidated, layout-independent checkpoints (DESIGN.md §2.5). Every tensor is stored whole at
// its global shape, written once: the ranks holding a part alike (replicas) each write a slice of
// it. Rank 0 makes the file's frame; every rank then writes its slices' bytes to their offsets,
// from a copy in host memory on a thread of its own while training goes on (or before going on).
// Loading reads, through parallel HDF5, whichever boxes a rank's own layout needs, so a checkpoint
// written in one layout loads into any other whose shapes fit. Each dataset carries the CRC-32 of
// its elements (little-endian float32, row-major), joined from the slices with crc32_combine.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"
#include "io/background_writer.hpp"
#include "io/checkpoint_exchange.hpp"
#include "io/checkpoint_state.hpp"
#include "model/state_ranges.hpp"

namespace mlptrain {

// A save that has ended: the file in place and what it took.
struct SavedCheckpoint {
  std::string file;
  std::int64_t step = 0;
  std::uint64_t bytes = 0;  // the tensors' bytes in the file, every rank's together
  std::uint64_t rank_bytes = 0;  // of those, this rank's
  double seconds = 0;       // from the start of the save until every rank's writes were durable
  double paused_ms = 0;     // of that, the time the caller stood still (copies, checksums, the frame; sync: all)
  double write_start_ms = 0, write_end_ms = 0;  // this rank's writes, on the clock of core/timer.hpp
  double gigabytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// Removes the step files of `directory` beyond the newest `keep` (by step), never the one
// `latest` names; a save in flight writes under another name and is left alone. Returns the
// names removed (a file that cannot be removed stays, and is not named).
std::vector<std::string> retire_checkpoints(const std::string& directory, int keep);

// Saves checkpoints, at most one in flight. Each save writes DIR/step_NNNNNNNN.h5 under a
// temporary name, renames it into place once every rank's writes are durable, then points
// DIR/latest at it; a save that does not end leaves the previous `latest` as it was.
class CheckpointSaver {
 public:
  CheckpointSaver() = default;
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;
  ~CheckpointSaver();

  // Makes ready, behind whatever the caller does next, the host memory a background save copies
  // into: allocated now (charged to the ledger on the CPU) and touched page by page on a thread of
  // its own, as are the regrouping's buffers; fresh pages cost the first save more than its copy.
  // For a run that will save in the background. Collective over scope.world.
  void prepare(const StatePlacement& placement, const CheckpointScope& scope);
  // Starts a save (none may be in flight): copies this rank's slices of the state to host memory
  // (unless written before returning from host memory), has rank 0 create the file's frame and
  // starts the writes, each slice's checksum first on the writer's thread: on a thread of their
  // own when `background`, else before returning. Collective over scope.world.
  void start(const std::string& directory, const TrainingState& state, const CheckpointDescription& description,
             const CheckpointScope& scope, bool background);
  bool in_flight() const { return in_flight_.has_value(); }
  // Whether this rank's writes of the save in flight are still going on.
  bool writing() const { return in_flight() && !writer_.ended(); }
  // Ends the save in flight: waits for this rank's writes, agrees on them (a failed write on any
  // rank is an AgreedError naming the file on every rank, as is a state that is not finite, whose
  // file is removed), joins the checksums into the file and puts it in place. Collective.
  SavedCheckpoint finish(Communicator& world);

 private:
  struct InFlight {
    std::filesystem::path temporary, final_path;
    SavedCheckpoint saved;
    std::vector<WrittenSlice> slices;            // this rank's, whose checksums the writer takes
    std::vector<ParameterTensor> global_tensors;  // the file's datasets
    double started_ms = 0;
    bool background = false;
  };
  // Where the snapshot holds each written slice of each part (index part x slices + slice; the
  // kept slices only when `copied`), and the floats it takes.
  struct SnapshotLayout {
    std::vector<std::size_t> positions;
    std::size_t floats = 0;
  };
  static SnapshotLayout snapshot_layout(const RegroupPlan& plan, bool copied);
  // Host memory for the copies, kept from save to save: on the CPU charged to the ledger.
  float* snapshot(std::size_t floats, Allocator& allocator);
  // Where the writer reads each written slice of each part (the kept slices, then the domains;
  // index part x slices + slice): the state's own host memory, or the snapshot, where the kept
  // slices are copied when `copied` and the domains' elements arrive. Collective.
  std::vector<const float*> host_sources(const RegroupPlan& plan, bool copied, const CheckpointScope& scope);
  void wait_until_prepared();

  std::optional<InFlight> in_flight_;
  Buffer charged_snapshot_;
  std::unique_ptr<float[], void (*)(void*)> snapshot_{nullptr, std::free};
  std::size_t snapshot_floats_ = 0;
  RegroupBuffers regroup_buffers_;
  std::thread preparing_;                      // touches what prepare() allocated
  std::vector<std::uint32_t> slice_checksums_;  // of the save in flight, from the writer's thread...
  std::int64_t non_finite_ = 0;                 // ...and the numbers of it that are not finite
  BackgroundWriter writer_;  // after the memory it reads, so that it ends first
};

// One save from start to end, before returning. Returns the final path. Collective.
std::string save_checkpoint(const std::string& directory, const TrainingState& state,
                            const CheckpointDescription& description, const CheckpointScope& scope);

// Loads a checkpoint file, or the one DIR/latest names when `path` is a directory, into `state`
// (parameters, moments and step), verifying format, shapes and checksums. Collective; any problem
// is the same Error on every rank; one of shapes names the options that differ from the stored
// configuration. Returns the file that was read.
std::string load_checkpoint(const std::string& path, TrainingState& state,
                            const CheckpointScope& scope);

// Checks (from rank 0) that `directory` exists or can be made and is writable; throws UsageError.
void prepare_checkpoint_directory(const std::string& directory);

}  // namespace mlptrain
