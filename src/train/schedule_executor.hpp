// Executes one rank's actions for a step (or an evaluation pass): forwards and backwards through
// the model runner, boundary transfers through the strategies. A transfer is waited for only when
// its memory is needed (a receive before the computation that reads it, a send before its data
// is freed, earlier gradient sends before another transfer buffer is allocated), and pending
// transfers are tested between computations, so they make progress
// (MPI moves large messages only inside its calls). A micro-batch's memory lives from its first
// action to its last use.
#pragma once

#include <functional>
#include <vector>

#include "core/trace.hpp"
#include "train/model_runner.hpp"
#include "train/strategy_stack.hpp"

namespace mlptrain {

struct LossTotals {
  double loss_sum = 0;
  double correct = 0;
};

struct ScheduleWork {
  bool training = true;
  int micro_batches = 1;
  LossKind loss_kind = LossKind::mse;
  std::int64_t loss_samples = 0;  // the loss is a mean over this many samples
  float loss_scale = 1.0f;        // its gradient is multiplied by this (fp16's loss scaling)
  std::function<std::int64_t(int micro_batch)> rows;
  // Fills what this rank needs of a micro-batch's samples (inputs, targets or labels).
  std::function<void(int micro_batch, MicroBatchActivations& activations)> read;
};

class ScheduleExecutor {
 public:
  ScheduleExecutor(ModelRunner& runner, StrategyStack& strategies, Allocator& allocator,
                   TraceRecorder* trace)
      : runner_(runner), strategies_(strategies), allocator_(allocator), trace_(trace) {}

  // The loss sums of the micro-batches whose loss this rank computes.
  LossTotals run(const std::vector<Action>& actions, const ScheduleWork& work);

 private:
  struct Transfer {
    ActionKind kind;
    int micro_batch;
    Request request;
  };
  void start(ActionKind kind, int micro_batch, void* data, std::int64_t count);
  void finish(ActionKind kind, int micro_batch);
  // Tests every pending transfer; a finished send of gradients frees their buffer.
  void progress();
  // Waits for every pending send of gradients and frees their buffers: done before each
  // allocation of a transfer buffer, so the peak of those is the same in every run (the cost
  // model's) whenever the sends happen to complete.
  void finish_gradient_sends();
  void release(const Transfer& transfer);
  MicroBatchActivations& prepared(int micro_batch, const ScheduleWork& work);
  // A schedule must receive what a computation needs before it: else it would compute on memory
  // nobody wrote.
  static void require_posted(bool posted, ActionKind kind, int micro_batch);

  ModelRunner& runner_;
  StrategyStack& strategies_;
  Allocator& allocator_;
  TraceRecorder* trace_;
  std::vector<MicroBatchActivations> micro_batches_;
  std::vector<bool> prepared_;
  std::vector<bool> input_posted_;     // per micro-batch: the receive of its activations
  std::vector<bool> gradient_posted_;  // and of its output gradients
  std::vector<Transfer> pending_;
};

}  // namespace mlptrain
