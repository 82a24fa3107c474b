// The run's state saved as consolidated checkpoints (io/checkpoint.hpp) and loaded back: the
// scope every rank takes part in (the world, the whole model's tensors, the configuration) and
// the description stored with each file (the configuration as INI text, the layout, the seed);
// the saver refuses to publish parameters or optimizer state that are not finite. Saving waits
// for an offloaded update and for the samples read ahead from a file (the frame and the
// checksums use the HDF5 library too); its writes go on behind training (--save-mode async)
// until the loop finds every rank's ended. The trace shows the pause and each rank's writes.
// With --keep-last, each published save retires the step files beyond the newest N.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "train/run.hpp"

namespace mlptrain {

class Checkpointer {
 public:
  explicit Checkpointer(Run& run) : run_(run) {}

  // Where training stands besides the state's tensors.
  struct Progress {
    std::int64_t step = 0;            // training steps taken
    std::int64_t optimizer_step = 0;  // updates applied (skipped steps do not count)
    double loss_scale = 0;            // fp16's loss scale (0: none)...
    std::int64_t loss_scale_finite_steps = 0;  // ...and the finite steps toward its doubling
  };
  // What --resume names to continue from: its file or directory, or with --resume auto the
  // checkpoint directory where it has a `latest` (none: a fresh start). Collective.
  std::optional<std::string> resume_source();
  // Loads `source` (a file, or a directory with `latest`) into the run's state and sets the data
  // position it continues from. Returns where the checkpoint stood (`start`: the loss scale this
  // run starts with, kept unless the checkpoint stored one) and the file it read. Collective.
  struct Resumed {
    Progress progress;
    std::string file;
  };
  Resumed resume(const std::string& source, const Progress& start);
  // Makes ready what the run's first background save needs (the host memory it copies into),
  // behind the steps before it. Collective.
  void prepare();
  // Starts saving the state; returns the saves this ended: the one in flight before, and this
  // one unless it goes on behind the steps that follow: with --save-mode async and
  // `steps_follow`. A save no step follows has nothing to overlap, and is written straight from
  // the state. Collective.
  std::vector<SavedCheckpoint> save(const Progress& progress, bool steps_follow);
  bool saving() const { return saver_.in_flight(); }
  // Whether this rank's writes of the save in flight are still going on.
  bool writing() const { return saver_.writing(); }
  // Ends the save in flight (waiting for the writes where needed). Collective.
  SavedCheckpoint finish();

 private:
  CheckpointScope scope() const;
  TrainingState state(const Progress& progress) const;

  Run& run_;
  CheckpointSaver saver_;
};

}  // namespace mlptrain
