// Executing a rank's actions (see schedule_executor.hpp).
#include "train/schedule_executor.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

#include "core/timer.hpp"

namespace mlptrain {

MicroBatchActivations& ScheduleExecutor::prepared(const Action& action, const ScheduleWork& work) {
  Slot& entry = slot(action);
  if (!entry.prepared) {
    ChunkRunner& runner = *runners_[static_cast<std::size_t>(action.chunk)];
    entry.activations = runner.prepare(work.rows(action.micro_batch), work.loss_kind);
    entry.prepared = true;
  }
  return entry.activations;
}

void ScheduleExecutor::start(const Action& action, void* data, std::int64_t count) {
  pending_.push_back({action.kind, action.micro_batch, action.chunk,
                      strategies_.start_transfer({.kind = action.kind,
                                                  .micro_batch = action.micro_batch,
                                                  .chunk = action.chunk,
                                                  .data = data,
                                                  .count = static_cast<std::size_t>(count),
                                                  .type = runners_.front()->activation_type()})});
}

void ScheduleExecutor::require_posted(bool posted, const Action& action) {
  if (!posted)
    throw std::logic_error(fmt::format("the schedule runs {} of micro-batch {} (chunk {}) before receiving its data",
                                       action_name(action.kind), action.micro_batch, action.chunk));
}

void ScheduleExecutor::release(const Transfer& transfer) {
  if (transfer.kind == ActionKind::send_gradients)
    slot({.micro_batch = transfer.micro_batch, .chunk = transfer.chunk}).activations.input_grad = Buffer{};
}

void ScheduleExecutor::finish(ActionKind kind, const Action& action) {
  const auto found = std::find_if(pending_.begin(), pending_.end(), [&](const Transfer& transfer) {
    return transfer.kind == kind && transfer.micro_batch == action.micro_batch && transfer.chunk == action.chunk;
  });
  if (found == pending_.end()) return;
  found->request.wait();
  release(*found);
  pending_.erase(found);
}

void ScheduleExecutor::finish_gradient_sends(int chunk) {
  std::erase_if(pending_, [&](Transfer& transfer) {
    if (transfer.kind != ActionKind::send_gradients || transfer.chunk != chunk) return false;
    transfer.request.wait();
    release(transfer);
    return true;
  });
}

void ScheduleExecutor::progress() {
  std::erase_if(pending_, [&](Transfer& transfer) {
    // A gradient send's buffer goes only where its chunk waits for it (finish_gradient_sends).
    if (!transfer.request.test() || transfer.kind == ActionKind::send_gradients) return false;
    release(transfer);
    return true;
  });
}

void ScheduleExecutor::before_backward(const Action& action) {
  progress();
  if (!runners_[static_cast<std::size_t>(action.chunk)]->computes_loss())
    require_posted(slot(action).gradient_posted, action);
  finish(ActionKind::receive_gradients, action);
  finish(ActionKind::send_activations, action);  // its data is about to be freed
  finish_gradient_sends(action.chunk);
}

LossTotals ScheduleExecutor::run(const std::vector<Action>& actions, const ScheduleWork& work) {
  micro_batches_ = work.micro_batches;
  slots_.clear();
  slots_.resize(runners_.size() * static_cast<std::size_t>(work.micro_batches));
  LossTotals totals;
  for (const Action& action : actions) {
    ChunkRunner& runner = *runners_.at(static_cast<std::size_t>(action.chunk));
    const int micro_batch = action.micro_batch;
    Slot& entry = slot(action);
    MicroBatchActivations& activations = prepared(action, work);
    const std::int64_t rows = work.rows(micro_batch);  // (a backward leaves activations empty)
    const auto computed = [&](std::string_view name, double start_ms) {
      record_span(trace_, std::string(name), start_ms, now_ms(), micro_batch, action.chunk);
    };
    switch (action.kind) {
      case ActionKind::receive_activations:
        entry.input_posted = true;
        start(action, activations.input.as<void>(), rows * runner.input_width());
        break;
      case ActionKind::forward: {
        progress();
        if (!runner.reads_inputs()) require_posted(entry.input_posted, action);
        finish(ActionKind::receive_activations, action);
        const double start_ms = now_ms();
        if (runner.reads_inputs() || runner.computes_loss()) work.read(micro_batch, activations, runner.reads_inputs());
        const LossSums sums = runner.forward(activations, micro_batch, work.micro_batches, work.training,
                                             work.loss_kind, work.loss_samples, work.loss_scale);
        computed(work.training ? "forward" : "evaluate_forward", start_ms);
        totals.loss_sum += sums.loss_sum;
        totals.correct += static_cast<double>(sums.correct);
        // Evaluation keeps nothing for a backward: memory goes as soon as the output is used.
        if (!work.training && runner.computes_loss()) activations = MicroBatchActivations{};
        break;
      }
      case ActionKind::send_activations:
        start(action, runner.output(activations), ChunkRunner::output_rows(activations) * runner.output_width());
        if (!work.training) {
          finish(action.kind, action);
          activations = MicroBatchActivations{};
        }
        break;
      case ActionKind::receive_gradients: {
        finish_gradient_sends(action.chunk);
        // The gradient of the chunk's output, as many rows as its last layer computed on.
        const std::int64_t count = ChunkRunner::output_rows(activations) * runner.output_width();
        activations.output_grad = allocator_.allocate_elements(MemoryState::comm_buffers, static_cast<std::size_t>(count),
                                                               runner.activation_type());
        entry.gradient_posted = true;
        start(action, activations.output_grad.as<void>(), count);
        break;
      }
      case ActionKind::backward:
      case ActionKind::backward_input: {
        before_backward(action);
        const double start_ms = now_ms();
        const BackwardPart part = action.kind == ActionKind::backward ? BackwardPart::whole : BackwardPart::input;
        runner.backward(activations, micro_batch, work.micro_batches, work.loss_scale, part);
        computed(action_name(action.kind), start_ms);
        break;
      }
      case ActionKind::backward_weight: {
        progress();
        const double start_ms = now_ms();
        runner.backward(activations, micro_batch, work.micro_batches, work.loss_scale, BackwardPart::weight);
        computed(action_name(action.kind), start_ms);
        break;
      }
      case ActionKind::send_gradients:
        start(action, activations.input_grad.as<void>(), rows * runner.input_width());
        break;
    }
  }
  for (Transfer& transfer : pending_) {
    transfer.request.wait();
    release(transfer);
  }
  pending_.clear();
  slots_.clear();
  return totals;
}

}  // namespace mlptrain
