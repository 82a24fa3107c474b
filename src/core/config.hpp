// The run's configuration as plain data: every option of DESIGN.md §2.3. Parsing and validation
// live in src/train/options.*; everything else reads this struct.
#pragma once

#include <cstdint>
#include <string>

namespace mlptrain {

struct Config {
  // Model
  int layers = 4;
  int hidden = 256;
  int input_dim = 0;   // 0: the dataset's
  int output_dim = 0;  // 0: the dataset's
  int moe_every = 0;
  int experts = 8;
  int top_k = 2;
  double capacity_factor = 0;
  double aux_loss_coef = 0.01;
  // Data
  std::string dataset = "teacher";
  std::string data_path;
  int global_batch = 128;
  int micro_batches = 1;
  bool shuffle = false;
  int eval_every = 0;
  // Training
  int steps = 100;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 0;
  std::string on_nan = "stop";  // a non-finite loss or gradient: stop | skip (the update)
  std::string lr_schedule = "constant";
  int warmup_steps = 0;
  std::int64_t seed = 1234;
  // Parallelism
  int dp = 0;  // 0: world / (tp * pp)
  int tp = 1;
  int pp = 1;
  int ep = 1;
  int zero = 0;
  std::string schedule = "1f1b";
  bool recompute = false;
  bool offload = false;
  // Devices
  std::string device = "cpu";
  bool tf32 = false;
  std::string comm = "mpi";
  // Output
  int log_every = 10;
  std::string metrics_path;
  std::string trace_path;
  std::string checkpoint_dir;
  int save_every = 0;
  std::string resume;
  bool predict = false;
  double timeout_s = 300;  // a step running longer is a hang: report and abort (0: never)
};

}  // namespace mlptrain
