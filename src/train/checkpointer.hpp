// The run's state saved as consolidated checkpoints (io/checkpoint.hpp) and loaded back: the
// scope every rank takes part in (the world, the whole model's tensors, the configuration), the
// description stored with each file (the configuration as INI text, the layout, the seed), and
// the refusal to save parameters that are not finite. Saving waits for an offloaded update.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.hpp"
#include "train/run.hpp"

namespace mlptrain {

class Checkpointer {
 public:
  explicit Checkpointer(Run& run) : run_(run) {}

  // Loads --resume into the run's state and sets the data position it continues from. Returns
  // the optimizer steps the checkpoint had taken and the file it read. Collective.
  struct Resumed {
    std::int64_t step = 0;
    std::string file;
  };
  Resumed resume();
  // Saves the state after `step` optimizer steps; returns the file written. Collective.
  std::string save(std::int64_t step);

 private:
  CheckpointScope scope() const;
  TrainingState state(std::int64_t step) const;

  Run& run_;
};

}  // namespace mlptrain
