// Chrome trace output (see trace_file.hpp).
#include "train/trace_file.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "core/error.hpp"

namespace mlptrain {

namespace {

constexpr const char* track_names[] = {"compute", "transfers", "collectives"};

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
  for (int track = 0; track < 3; ++track)
    append({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", track},
            {"args", {{"name", track_names[track]}}}});
  for (const TraceSpan& span : recorder.spans()) {
    nlohmann::json args = {{"step", span.step}};
    if (span.micro_batch >= 0) args["micro_batch"] = span.micro_batch;
    if (span.bytes > 0) args["bytes"] = span.bytes;
    if (!span.group.empty()) args["group"] = span.group;
    append({{"ph", "X"}, {"name", span.name}, {"cat", track_names[static_cast<int>(span.track)]},
            {"pid", rank}, {"tid", static_cast<int>(span.track)},
            {"ts", (span.start_ms - origin_ms) * 1000.0},
            {"dur", (span.end_ms - span.start_ms) * 1000.0}, {"args", std::move(args)}});
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
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const std::string mine = rank_events(recorder, origin_ms, rank, place);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, world);
  std::string all;
  if (rank == 0) {
    std::size_t total = 0;
    for (int index = 0; index < size; ++index) {
      offsets[static_cast<std::size_t>(index)] = static_cast<int>(total);
      total += static_cast<std::size_t>(lengths[static_cast<std::size_t>(index)]);
    }
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, world);
  if (rank != 0) return;
  std::string events;
  for (int index = 0; index < size; ++index) {
    const auto begin = static_cast<std::size_t>(offsets[static_cast<std::size_t>(index)]);
    const auto count = static_cast<std::size_t>(lengths[static_cast<std::size_t>(index)]);
    if (!events.empty()) events += ",\n";
    events.append(all, begin, count);
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::trunc);
    file << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << run.dump() << ",\n\"traceEvents\":["
         << events << "]}\n";
    if (!file.flush()) throw RuntimeFailure("--trace: writing '" + temporary + "' failed");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw RuntimeFailure("--trace: cannot rename '" + temporary + "' to '" + path + "'");
}

}  // namespace mlptrain
