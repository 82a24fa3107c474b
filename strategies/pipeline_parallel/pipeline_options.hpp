// Pipeline parallelism's own options, declared by its registration (pipeline_parallel.cpp) and kept in the
// run's configuration as this block. The schedule is its table entry, resolved from its name
// when the option is read.
#pragma once

#include "schedule/schedule_table.hpp"

namespace mlptrain {

struct PipelineOptions {
  ScheduleChoice schedule = default_schedule();  // --schedule
  int virtual_stages = 1;                        // --virtual-stages: model chunks a stage (chunked schedules)
};

}  // namespace mlptrain
