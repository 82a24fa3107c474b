// What a checkpoint holds, describes and spans: the training state it saves and restores, the
// run's description it carries, and the ranks and tensors taking part; the format's name and
// version; a checkpoint file's name. Shared by the checkpoint's saving, its file and its layout.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/buffer.hpp"
#include "model/state_ranges.hpp"

namespace mlptrain {

inline constexpr const char* checkpoint_format = "mlptrain-checkpoint";
inline constexpr std::int64_t checkpoint_format_version = 1;

// The state a checkpoint holds: the runs a rank updates (fp32 master weights and AdamW moments;
// each copy writes its slice of them), the runs of values it holds (read back on load, rounded to the
// param type), the training steps taken, the updates AdamW applied (its step: skipped steps do not
// count), the data position (global samples consumed) to continue from, and fp16's loss scale
// with the finite steps counted toward its next doubling.
struct TrainingState {
  const StatePlacement& placement;
  std::int64_t step = 0;
  std::int64_t optimizer_step = 0;
  std::int64_t data_position = 0;
  double loss_scale = 0;  // 0: the run scales no loss
  std::int64_t loss_scale_finite_steps = 0;
};

struct CheckpointDescription {
  std::string config_ini;
  std::string layout;  // e.g. "dp=2 tp=1 pp=1 ep=1 zero=0"
  std::int64_t seed = 0;
};

// The ranks taking part, the whole model's tensors, and the run's configuration (to name what
// differs when a checkpoint does not fit).
struct CheckpointScope {
  Communicator& world;
  MPI_Comm mpi_comm;     // the same ranks as `world`, for MPI-IO
  Allocator& allocator;  // staging buffers (workspace)
  std::vector<ParameterTensor> global_tensors;  // every tensor of the model, whole
  int layer_count = 0;
  std::string config_ini;                  // this run's configuration
  std::vector<std::string> shape_options;  // the options that decide the tensors' shapes
};

std::string checkpoint_file_name(std::int64_t step);

}  // namespace mlptrain
