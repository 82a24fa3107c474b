// Executes one rank's actions for a step (or an evaluation pass): forwards and backwards through
// the model runners (one per model chunk the rank holds), boundary transfers through the
// strategies. A transfer is waited for only when its memory is needed (a receive before the
// computation that reads it, a send before its data is freed, the chunk's earlier gradient sends
// before another transfer buffer is allocated for it), and pending transfers are tested between computations,
// so they make progress (MPI moves large messages only inside its calls). A (chunk,
// micro-batch)'s memory lives from its first action to its last use.
#pragma once

#include <functional>
#include <vector>

#include "core/trace.hpp"
#include "chunk/chunk_runner.hpp"
#include "strategies/strategy_stack.hpp"

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
  // Fills what a chunk needs of a micro-batch's samples: called before the forward of a chunk
  // that starts the model (`inputs`: the inputs, and the targets or labels where the rank
  // computes the loss) or computes the loss (the targets or labels alone where another of the
  // rank's chunks starts the model, as a V's last chunk on stage 0).
  std::function<void(int micro_batch, MicroBatchActivations& activations, bool inputs)> read;
};

class ScheduleExecutor {
 public:
  // `runners`: the rank's model chunks in local order.
  ScheduleExecutor(std::vector<ChunkRunner*> runners, StrategyStack& strategies, Allocator& allocator,
                   TraceRecorder* trace)
      : runners_(std::move(runners)), strategies_(strategies), allocator_(allocator), trace_(trace) {}

  // The loss sums of the micro-batches whose loss this rank computes.
  LossTotals run(const std::vector<Action>& actions, const ScheduleWork& work);

 private:
  struct Transfer {
    ActionKind kind;
    int micro_batch;
    int chunk;
    Request request;
  };
  // A (chunk, micro-batch)'s activations and which of its receives the schedule has posted.
  struct Slot {
    MicroBatchActivations activations;
    bool prepared = false;
    bool input_posted = false;
    bool gradient_posted = false;
  };
  Slot& slot(const Action& action) {
    return slots_[static_cast<std::size_t>(action.chunk * micro_batches_ + action.micro_batch)];
  }
  void start(const Action& action, void* data, std::int64_t count);
  void finish(ActionKind kind, const Action& action);
  // Tests every pending transfer; a finished one is done with (a send of gradients waits for
  // its chunk's next finish_gradient_sends).
  void progress();
  // Waits for the chunk's pending sends of gradients and frees their buffers: done before each
  // allocation of a transfer buffer for the chunk, so the peak of those is the same in every run
  // (the cost model's) whenever the sends happen to complete. Only the chunk's: waiting for
  // another chunk's send could wait on a stage that waits on this one (the schedule checker
  // proves the lists free of deadlock under exactly these waits).
  void finish_gradient_sends(int chunk);
  void release(const Transfer& transfer);
  MicroBatchActivations& prepared(const Action& action, const ScheduleWork& work);
  // A computation waiting for a neighbour's gradient: that receive, and the memory it frees.
  void before_backward(const Action& action);
  // A schedule must receive what a computation needs before it: else it would compute on memory
  // nobody wrote.
  static void require_posted(bool posted, const Action& action);

  std::vector<ChunkRunner*> runners_;
  StrategyStack& strategies_;
  Allocator& allocator_;
  TraceRecorder* trace_;
  int micro_batches_ = 0;
  std::vector<Slot> slots_;
  std::vector<Transfer> pending_;
};

}  // namespace mlptrain
