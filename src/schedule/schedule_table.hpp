// The pipeline schedules as one table. An entry is everything the rest of the project knows of a
// schedule: its name as --schedule spells it, where it comes from, whether it places several
// model chunks on a stage, what it needs of a pipeline's shape, the order of a stage's
// computations, and its theory (the most micro-batches a stage keeps in flight and the idle
// fraction). Options, validation, the pipeline strategy, the cost model and the planner's
// choices all read this table; a new schedule is an entry and its order function. A stage's list
// under an entry (its order, with the transfers placed) is made here too.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/option_declaration.hpp"
#include "schedule/schedule.hpp"

namespace mlptrain {

struct ScheduleEntry {
  std::string_view name;    // as --schedule and INI files spell it
  std::string_view source;  // the literature it follows, for the run's header
  // Several model chunks a stage (--virtual-stages V); the others hold one, or two in a V.
  bool chunked = false;
  ChunkPlacement placement = ChunkPlacement::looped;
  // What the shape must satisfy beyond one chunk a stage for an unchunked schedule (empty: it
  // suits); null: nothing more.
  std::string (*shape_problem)(const PipelineShape& shape) = nullptr;
  // The computations alone of stage `stage`'s training list, in the schedule's order (the
  // transfers are placed among them by stage_schedule).
  std::vector<Action> (*order)(const PipelineShape& shape, int stage) = nullptr;
  // The most (chunk, micro-batch) pairs a stage keeps in flight, by the schedule's theory.
  int (*peak_in_flight)(const PipelineShape& shape, int stage) = nullptr;
  // The idle fraction of a step by the schedule's theory (equal stages, free transfers), and
  // its formula as text for reports.
  double (*bubble)(const PipelineShape& shape) = nullptr;
  std::string_view bubble_formula;

  bool operator==(const ScheduleEntry& other) const { return name == other.name; }
};

// Every schedule, the default (1F1B) first.
std::span<const ScheduleEntry> schedule_table();
// A schedule as options and the pipeline's configuration hold it: its table entry.
using ScheduleChoice = std::reference_wrapper<const ScheduleEntry>;
inline ScheduleChoice default_schedule() { return schedule_table().front(); }
// The entry named `name`, or null.
const ScheduleEntry* find_schedule(std::string_view name);
// The entry named `name`; a logic_error when there is none (names are validated on input).
const ScheduleEntry& schedule_named(std::string_view name);
// "1f1b | gpipe | ...": the names, for help and messages.
std::string schedule_names();

// --schedule reads a name and holds its entry.
template <>
struct ChoiceTraits<ScheduleChoice> {
  static std::string_view name(const ScheduleChoice& choice) { return choice.get().name; }
  static std::optional<ScheduleChoice> parse(std::string_view text) {
    const ScheduleEntry* entry = find_schedule(text);
    return entry != nullptr ? std::optional<ScheduleChoice>(*entry) : std::nullopt;
  }
  static std::string list() { return schedule_names(); }
};

// Why a shape does not suit `schedule` (empty when it does): every count at least 1, the
// schedule's placement, one chunk a stage unless the schedule is chunked (two in a V), and the
// schedule's own rule.
std::string schedule_shape_problem(const ScheduleEntry& schedule, const PipelineShape& shape);

// The shape `schedule` runs: V chunks a stage where it is chunked, two in a V, else one.
PipelineShape schedule_shape(const ScheduleEntry& schedule, int stages, int virtual_stages, int micro_batches);

// Forwards 1F1B runs at `stage` before its first backward, beyond the one it pairs with it.
int one_f_one_b_warmup(int stages, int stage, int micro_batches);

// Stage `stage`'s list under `schedule` (the shape must suit it when training): the computations in
// the schedule's order, each receive posted one computation ahead of the one that needs it (so
// the transfer overlaps the computation before; after a W rather than ahead of it, since a W
// frees the gradients kept for it), each send right after the computation that produced its
// data. Each chunk's backwards run in micro-batch order under every schedule, so
// gradients accumulate in the same order as without a pipeline. Without training, the forward
// passes alone, each micro-batch through the chunks in turn.
std::vector<Action> stage_schedule(const ScheduleEntry& schedule, const PipelineShape& shape, int stage,
                                   bool training = true);

}  // namespace mlptrain
