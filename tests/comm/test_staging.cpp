// The host-staging chunk pipeline with a fake copier (no GPU, no MPI): every chunk goes up,
// through the MPI step and back down in order; no slot is refilled before its previous chunk is
// back; and while chunk i is communicated, chunk i+1's upload and chunk i-1's download are in
// flight. A copier that really moves bytes then carries a buffer through the pipeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "comm/staging.hpp"

using namespace mlptrain;

namespace {

// Records every event with its time (a counter); copies are "in flight" from start to wait.
class RecordingCopier final : public ChunkCopier {
 public:
  std::map<std::string, std::map<std::size_t, int>> when;  // event -> chunk -> time
  std::vector<int> slot_holder = std::vector<int>(staging_slots, -1);  // chunk in each slot, or -1
  std::vector<std::string> problems;

  void start_to_host(std::size_t chunk, int slot) override {
    if (slot_holder[slot] != -1)
      problems.push_back("chunk " + std::to_string(chunk) + " refills slot " + std::to_string(slot) +
                         " while chunk " + std::to_string(slot_holder[slot]) + " holds it");
    slot_holder[slot] = static_cast<int>(chunk);
    record("start_to_host", chunk);
  }
  void wait_to_host(std::size_t chunk) override { record("wait_to_host", chunk); }
  void start_to_device(std::size_t chunk, int slot) override {
    if (slot_holder[slot] != static_cast<int>(chunk)) problems.push_back("download from the wrong slot");
    record("start_to_device", chunk);
  }
  void wait_to_device(std::size_t chunk) override {
    for (int& holder : slot_holder)
      if (holder == static_cast<int>(chunk)) holder = -1;
    record("wait_to_device", chunk);
  }
  void record(const std::string& event, std::size_t chunk) {
    if (when[event].contains(chunk)) problems.push_back(event + " twice for chunk " + std::to_string(chunk));
    when[event][chunk] = clock++;
  }
  int clock = 0;
};

TEST(Staging, ChunkCountCoversTheMessage) {
  EXPECT_EQ(chunk_count(0, 4), 1u);
  EXPECT_EQ(chunk_count(8, 4), 2u);
  EXPECT_EQ(chunk_count(9, 4), 3u);
  EXPECT_EQ(chunk_count(3, 4), 1u);
}

TEST(Staging, PipelineOrderOverlapsUploadCommunicationAndDownload) {
  for (std::size_t chunks : {1u, 2u, 3u, 4u, 7u, 16u}) {
    SCOPED_TRACE("chunks " + std::to_string(chunks));
    RecordingCopier copier;
    std::vector<std::size_t> communicated;
    run_staged_pipeline(chunks, copier, [&](std::size_t chunk, int slot) {
      if (copier.slot_holder[slot] != static_cast<int>(chunk)) copier.problems.push_back("communicates the wrong slot");
      communicated.push_back(chunk);
      copier.record("communicate", chunk);
    });
    EXPECT_TRUE(copier.problems.empty()) << copier.problems.front();
    std::vector<std::size_t> in_order(chunks);
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) in_order[chunk] = chunk;
    EXPECT_EQ(communicated, in_order);
    auto& at = copier.when;
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      // Each chunk once, in its own order, and every one back on the device at the end.
      for (const char* event : {"start_to_host", "wait_to_host", "communicate", "start_to_device", "wait_to_device"})
        ASSERT_TRUE(at[event].contains(chunk)) << event << " of chunk " << chunk;
      EXPECT_LT(at["start_to_host"][chunk], at["wait_to_host"][chunk]);
      EXPECT_LT(at["wait_to_host"][chunk], at["communicate"][chunk]);
      EXPECT_LT(at["communicate"][chunk], at["start_to_device"][chunk]);
      EXPECT_LT(at["start_to_device"][chunk], at["wait_to_device"][chunk]);
      // The overlap: chunk + 1's upload and chunk - 1's download are in flight during chunk.
      if (chunk + 1 < chunks) {
        EXPECT_LT(at["start_to_host"][chunk + 1], at["communicate"][chunk]);
        EXPECT_GT(at["wait_to_host"][chunk + 1], at["communicate"][chunk]);
      }
      if (chunk >= 1) {
        EXPECT_LT(at["start_to_device"][chunk - 1], at["communicate"][chunk]);
        EXPECT_GT(at["wait_to_device"][chunk - 1], at["communicate"][chunk]);
      }
    }
  }
}

// "Device" memory on the host: copies are memcpy, done when started.
class HostCopier final : public ChunkCopier {
 public:
  HostCopier(std::vector<float>& device, std::size_t chunk_floats)
      : device_(device), chunk_floats_(chunk_floats),
        slots_(staging_slots, std::vector<float>(chunk_floats)) {}
  void start_to_host(std::size_t chunk, int slot) override {
    std::copy_n(device_.begin() + begin(chunk), length(chunk), slots_[slot].begin());
  }
  void wait_to_host(std::size_t) override {}
  void start_to_device(std::size_t chunk, int slot) override {
    std::copy_n(slots_[slot].begin(), length(chunk), device_.begin() + begin(chunk));
  }
  void wait_to_device(std::size_t) override {}
  std::size_t length(std::size_t chunk) const {
    return std::min(chunk_floats_, device_.size() - begin(chunk));
  }

 private:
  std::size_t begin(std::size_t chunk) const { return chunk * chunk_floats_; }
  std::vector<float>& device_;
  std::size_t chunk_floats_;

 public:
  std::vector<std::vector<float>> slots_;  // the pinned host slots
};

TEST(Staging, CarriesEveryElementThroughTheMessageStep) {
  std::vector<float> device(1003);
  for (std::size_t i = 0; i < device.size(); ++i) device[i] = static_cast<float>(i);
  const std::size_t chunk_floats = 64;
  HostCopier copier(device, chunk_floats);
  // A stand-in for an in-place all-reduce over 3 ranks holding the same values.
  run_staged_pipeline(chunk_count(device.size() * 4, chunk_floats * 4), copier, [&](std::size_t chunk, int slot) {
    for (std::size_t i = 0; i < copier.length(chunk); ++i) copier.slots_[slot][i] *= 3.0f;
  });
  for (std::size_t i = 0; i < device.size(); ++i) ASSERT_EQ(device[i], 3.0f * static_cast<float>(i)) << i;
}

}  // namespace
