// Proofs and timelines of a pipeline's lists (one per stage), both by simulation on the CPU.
//   check_schedule: runs every stage's list the way the executor does, with MPI's strictest
//     semantics: sends and receives are only posted, and a send completes only once its receive
//     is posted (a rendezvous). A forward waits until its input's receive is posted here and the
//     matching send was posted by the stage of the chunk before; a backward (or its B) likewise
//     from the chunk after, and first waits for its own activation send to complete (its memory
//     is freed); a backward (or B) and a receive of gradients first wait for the chunk's earlier
//     gradient sends (the executor allocates a transfer buffer once theirs are freed); a W waits
//     for its B; evaluation waits for each send at once; a list ends waiting
//     for every send. Every condition, once true, stays true, so if one interleaving of the
//     stages finishes, every interleaving does: running each stage as far as it can in turn finds
//     a deadlock if any order has one. It also checks that every transfer pairs up, that every
//     (chunk, micro-batch) runs forward once and backward once (whole, or B then W), and that a
//     chunk's weight gradients come in micro-batch order, so they accumulate as one process's do.
//   schedule_timeline: when each computation starts and ends given the time of F, B and W
//     (transfers free), so a schedule's bubble can be held against its theory.
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule_table.hpp"

namespace mlptrain {

// The first problem found, or empty when the lists run to the end.
std::string check_schedule(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape, bool training);

// Every stage's list for one schedule and shape.
std::vector<std::vector<Action>> all_stage_schedules(const ScheduleEntry& schedule, const PipelineShape& shape, bool training);

// Times of a chunk's computations (a whole backward takes B + W).
struct ComputeTimes {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

struct Timeline {
  double makespan = 0;             // until the last stage's last computation ends
  std::vector<double> busy;        // per stage: time computing
  double bubble_fraction() const;  // idle over (stages x makespan)
};

// Start each computation as soon as its stage is free and its input has been computed (lists
// must pass check_schedule).
Timeline schedule_timeline(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape,
                           const ComputeTimes& times);
// The same with each chunk's own times, indexed [stage][the stage's local chunk].
Timeline schedule_timeline(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape,
                           const std::vector<std::vector<ComputeTimes>>& chunk_times);

}  // namespace mlptrain
