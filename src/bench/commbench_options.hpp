// commbench's command line: what to measure (collectives, path, element types, sizes) and how to
// report it (which rank's time, table, JSON lines, CSV). Bad input is a UsageError naming the
// option.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/data_type.hpp"

namespace mlptrain {

// Which time across ranks a row reports (nccl-tests' -a): rank 0's, the average, the fastest
// rank's or the slowest rank's (the default: the one that bounds a training step).
enum class TimeReport { rank0, average, minimum, maximum };
std::string_view time_report_name(TimeReport report);

// How each operation is issued: run to completion, or started as the strategies start theirs and
// waited for (with --overlap, while the host computes).
enum class Issue { blocking, started };
std::string_view issue_name(Issue issue);

struct CommbenchSettings {
  std::vector<std::string> collectives;
  std::string path = "mpi-host";
  std::vector<DataType> dtypes = {DataType::float32};
  std::string device = "cuda";         // of the staged path
  std::int64_t chunk_bytes = 4 << 20;  // of the staged path's pieces; 0: one piece
  std::vector<Issue> issues = {Issue::blocking};
  bool overlap = false;  // time started operations again beside host computation
  std::int64_t min_bytes = 8;
  std::int64_t max_bytes = std::int64_t{256} << 20;
  int step_factor = 2;
  int iterations = 20;
  int warmup = 5;
  TimeReport report = TimeReport::maximum;
  bool json = false;
  std::string csv_path;  // empty: no CSV
  bool help = false;
  std::string help_text;
};

extern const std::vector<std::string> all_collectives;
// Not collectives: each rank's background copies between its device buffer and page-locked host
// memory (the device's copier, as host staging uses it), timed beside them on the device paths.
bool is_device_copy(const std::string& name);

CommbenchSettings parse_commbench_options(int argc, char** argv);

}  // namespace mlptrain
