// The computations alone of a stage's list under each schedule, before schedule.cpp places the
// transfers among them.
#pragma once

#include <vector>

#include "schedule/schedule.hpp"

namespace mlptrain {

// The shape must suit the schedule (schedule_shape_problem); a logic_error otherwise.
std::vector<Action> computation_order(ScheduleKind kind, const PipelineShape& shape, int stage);

}  // namespace mlptrain
