// Executing a rank's actions (see schedule_executor.hpp).
#include "train/schedule_executor.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

#include "core/timer.hpp"

namespace mlptrain {

MicroBatchActivations& ScheduleExecutor::prepared(int micro_batch, const ScheduleWork& work) {
  const auto index = static_cast<std::size_t>(micro_batch);
  if (!prepared_[index]) {
    micro_batches_[index] = runner_.prepare(work.rows(micro_batch), work.loss_kind);
    prepared_[index] = true;
  }
  return micro_batches_[index];
}

void ScheduleExecutor::start(ActionKind kind, int micro_batch, void* data, std::int64_t count) {
  pending_.push_back({kind, micro_batch,
                      strategies_.start_transfer({.kind = kind,
                                                  .micro_batch = micro_batch,
                                                  .data = data,
                                                  .count = static_cast<std::size_t>(count),
                                                  .type = runner_.activation_type()})});
}

void ScheduleExecutor::require_posted(bool posted, ActionKind kind, int micro_batch) {
  if (!posted)
    throw std::logic_error(fmt::format("the schedule runs {} of micro-batch {} before receiving its data",
                                       action_name(kind), micro_batch));
}

void ScheduleExecutor::release(const Transfer& transfer) {
  if (transfer.kind == ActionKind::send_gradients)
    micro_batches_[static_cast<std::size_t>(transfer.micro_batch)].input_grad = Buffer{};
}

void ScheduleExecutor::finish(ActionKind kind, int micro_batch) {
  const auto found = std::find_if(pending_.begin(), pending_.end(), [&](const Transfer& transfer) {
    return transfer.kind == kind && transfer.micro_batch == micro_batch;
  });
  if (found == pending_.end()) return;
  found->request.wait();
  release(*found);
  pending_.erase(found);
}

void ScheduleExecutor::finish_gradient_sends() {
  std::erase_if(pending_, [&](Transfer& transfer) {
    if (transfer.kind != ActionKind::send_gradients) return false;
    transfer.request.wait();
    release(transfer);
    return true;
  });
}

void ScheduleExecutor::progress() {
  std::erase_if(pending_, [&](Transfer& transfer) {
    if (!transfer.request.test()) return false;
    release(transfer);
    return true;
  });
}

LossTotals ScheduleExecutor::run(const std::vector<Action>& actions, const ScheduleWork& work) {
  micro_batches_.clear();
  micro_batches_.resize(static_cast<std::size_t>(work.micro_batches));
  prepared_.assign(static_cast<std::size_t>(work.micro_batches), false);
  input_posted_.assign(static_cast<std::size_t>(work.micro_batches), false);
  gradient_posted_.assign(static_cast<std::size_t>(work.micro_batches), false);
  LossTotals totals;
  for (const Action& action : actions) {
    // The runner holds one contiguous range of layers and runs a backward whole.
    if (action.chunk != 0 || action.kind == ActionKind::backward_input || action.kind == ActionKind::backward_weight)
      throw std::logic_error(fmt::format("the executor runs one chunk and whole backwards, not {} of chunk {}",
                                         action_name(action.kind), action.chunk));
    const int micro_batch = action.micro_batch;
    MicroBatchActivations& activations = prepared(micro_batch, work);
    const std::int64_t rows = work.rows(micro_batch);  // (a backward leaves activations empty)
    switch (action.kind) {
      case ActionKind::receive_activations:
        input_posted_[static_cast<std::size_t>(micro_batch)] = true;
        start(action.kind, micro_batch, activations.input.as<void>(), rows * runner_.input_width());
        break;
      case ActionKind::forward: {
        progress();
        if (!runner_.reads_inputs())
          require_posted(input_posted_[static_cast<std::size_t>(micro_batch)], action.kind, micro_batch);
        finish(ActionKind::receive_activations, micro_batch);
        const double start_ms = now_ms();
        work.read(micro_batch, activations);
        const LossSums sums = runner_.forward(activations, micro_batch, work.micro_batches, work.training,
                                              work.loss_kind, work.loss_samples, work.loss_scale);
        record_span(trace_, work.training ? "forward" : "evaluate_forward", start_ms, now_ms(), micro_batch);
        totals.loss_sum += sums.loss_sum;
        totals.correct += static_cast<double>(sums.correct);
        // Evaluation keeps nothing for a backward: memory goes as soon as the output is used.
        if (!work.training && runner_.computes_loss()) activations = MicroBatchActivations{};
        break;
      }
      case ActionKind::send_activations:
        start(action.kind, micro_batch, runner_.output(activations),
              ModelRunner::output_rows(activations) * runner_.output_width());
        if (!work.training) {
          finish(action.kind, micro_batch);
          activations = MicroBatchActivations{};
        }
        break;
      case ActionKind::receive_gradients: {
        finish_gradient_sends();
        // The gradient of the stage's output, as many rows as its last layer computed on.
        const std::int64_t count = ModelRunner::output_rows(activations) * runner_.output_width();
        activations.output_grad = allocator_.allocate_elements(MemoryState::comm_buffers, static_cast<std::size_t>(count),
                                                               runner_.activation_type());
        gradient_posted_[static_cast<std::size_t>(micro_batch)] = true;
        start(action.kind, micro_batch, activations.output_grad.as<void>(), count);
        break;
      }
      case ActionKind::backward: {
        progress();
        if (!runner_.computes_loss())
          require_posted(gradient_posted_[static_cast<std::size_t>(micro_batch)], action.kind, micro_batch);
        finish(ActionKind::receive_gradients, micro_batch);
        finish(ActionKind::send_activations, micro_batch);  // its data is about to be freed
        finish_gradient_sends();
        const double start_ms = now_ms();
        runner_.backward(activations, micro_batch, work.micro_batches, work.loss_scale);
        record_span(trace_, "backward", start_ms, now_ms(), micro_batch);
        break;
      }
      case ActionKind::send_gradients:
        start(action.kind, micro_batch, activations.input_grad.as<void>(), rows * runner_.input_width());
        break;
      case ActionKind::backward_input:
      case ActionKind::backward_weight: break;  // refused above
    }
  }
  for (Transfer& transfer : pending_) {
    transfer.request.wait();
    release(transfer);
  }
  pending_.clear();
  micro_batches_.clear();
  return totals;
}

}  // namespace mlptrain
