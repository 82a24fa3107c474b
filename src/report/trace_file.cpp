// Chrome trace output (see trace_file.hpp).
#include "report/trace_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "comm/rank_texts.hpp"
#include "core/error.hpp"

namespace mlptrain {

namespace {

constexpr const char* track_names[] = {"compute", "transfers", "collectives", "storage"};

// This rank's events, as JSON objects separated by commas (joined with the others' on rank 0).
std::string rank_events(const TraceRecorder& recorder, double origin_ms, int rank,
                        const GridCoordinates& place) {
  std::string text;
  const auto append = [&](const nlohmann::json& event) {
    if (!text.empty()) text += ',';
    text += event.dump();
  };
  append({{"ph", "M"}, {"name", "process_name"}, {"pid", rank},
          {"args", {{"name", fmt::format("rank {} (stage {}, dp {}, tp {})", rank, place.pp,
                                         place.dp, place.tp)},
                    {"rank", rank}, {"stage", place.pp}, {"dp", place.dp}, {"tp", place.tp},
                    {"ep", place.ep}, {"dropped_spans", recorder.dropped()}}}});
  // Stages top to bottom, as in the pipeline papers' figures.
  append({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank},
          {"args", {{"sort_index", rank}}}});
  for (int track = 0; track < static_cast<int>(std::size(track_names)); ++track)
    append({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", track},
            {"args", {{"name", track_names[track]}}}});
  std::size_t index = 0;
  for (const TraceSpan& span : recorder.spans()) {
    nlohmann::json args = {{"step", span.step}};
    if (span.micro_batch >= 0) args["micro_batch"] = span.micro_batch;
    if (span.chunk >= 0) args["chunk"] = span.chunk;
    if (span.bytes > 0) args["bytes"] = span.bytes;
    if (!span.group.empty()) {
      args["group"] = span.group;
      args["dtype"] = data_type_name(span.type);
    }
    const char* category = track_names[static_cast<int>(span.track)];
    const double start_us = (span.start_ms - origin_ms) * 1000.0;
    const double duration_us = (span.end_ms - span.start_ms) * 1000.0;
    if (span.track == TraceTrack::compute) {
      append({{"ph", "X"}, {"name", span.name}, {"cat", category}, {"pid", rank}, {"tid", 0},
              {"ts", start_us}, {"dur", duration_us}, {"args", std::move(args)}});
      continue;
    }
    // Transfers, collectives and writes overlap one another: asynchronous begin/end pairs, each its own.
    const std::string id = fmt::format("{}.{}", rank, index++);
    append({{"ph", "b"}, {"name", span.name}, {"cat", category}, {"id", id}, {"pid", rank},
            {"tid", static_cast<int>(span.track)}, {"ts", start_us}, {"args", std::move(args)}});
    append({{"ph", "e"}, {"name", span.name}, {"cat", category}, {"id", id}, {"pid", rank},
            {"tid", static_cast<int>(span.track)}, {"ts", start_us + duration_us}});
  }
  return text;
}

}  // namespace

void check_trace_path(const std::string& path) {
  std::ofstream probe(path + ".tmp");
  if (!probe) throw UsageError("--trace: cannot create '" + path + "'");
  probe.close();
  std::remove((path + ".tmp").c_str());
}

void write_trace(const std::string& path, const TraceRecorder& recorder, double origin_ms,
                 MPI_Comm world, const GridCoordinates& place, const nlohmann::json& run) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // Every rank's events go to rank 0 in turn and straight into the file: rank 0 never holds
  // more than one rank's events.
  const std::string temporary = path + ".tmp";
  std::ofstream file;
  if (rank == 0) {
    file.open(temporary, std::ios::trunc);
    file << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << run.dump() << ",\n\"traceEvents\":[";
  }
  bool first = true;
  texts_to_rank_zero(world, rank_events(recorder, origin_ms, rank, place), [&](const std::string& events) {
    file << (first ? "" : ",\n") << events;
    first = false;
  });
  if (rank != 0) return;
  file << "]}\n";
  if (!file.flush()) throw RuntimeFailure("--trace: writing '" + temporary + "' failed");
  file.close();
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw RuntimeFailure("--trace: cannot rename '" + temporary + "' to '" + path + "'");
}

}  // namespace mlptrain
