// Train room: the sample feed reads the same samples whether it reads ahead or not, reads ahead
// on another thread only off the CPU and only for datasets that allow it, falls back to reading
// at once when the read ahead was for other samples, and turns a failed read into zeros and a
// problem.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/memory_ledger.hpp"
#include "kernels/loopback/loopback_backend.hpp"
#include "train/sample_feed.hpp"

using namespace mlptrain;

namespace {

// Sample i's inputs are i * 10 + column, its label i % 3; records which thread read what.
class RecordingDataset final : public Dataset {
 public:
  explicit RecordingDataset(bool any_thread) : any_thread_(any_thread) {}
  const DatasetInfo& info() const override { return info_; }
  bool readable_from_any_thread() const override { return any_thread_; }
  void read(Split, std::span<const std::int64_t> indices, float* inputs, float*,
            std::int32_t* labels) override {
    {
      const std::lock_guard lock(mutex_);
      readers.push_back(std::this_thread::get_id());
    }
    for (std::size_t row = 0; row < indices.size(); ++row) {
      if (indices[row] < 0) throw RuntimeFailure("sample " + std::to_string(indices[row]) + " is unreadable");
      for (int column = 0; column < 2; ++column)
        if (inputs != nullptr) inputs[row * 2 + column] = static_cast<float>(indices[row] * 10 + column);
      if (labels != nullptr) labels[row] = static_cast<std::int32_t>(indices[row] % 3);
    }
  }
  std::vector<std::thread::id> readers;

 private:
  DatasetInfo info_{"recording", 100, 0, 2, 3, TargetKind::classification};
  bool any_thread_;
  std::mutex mutex_;
};

struct Fed {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;
};

Fed feed_through(SampleFeed& feed, Allocator& memory, const std::vector<std::int64_t>& indices) {
  Buffer inputs = memory.allocate_floats(MemoryState::activations, indices.size() * 2);
  Buffer labels = memory.allocate(MemoryState::activations, indices.size() * sizeof(std::int32_t));
  feed.read(Split::train, indices, {&inputs, nullptr, &labels});
  Fed fed{std::vector<float>(indices.size() * 2), std::vector<std::int32_t>(indices.size())};
  memory.copy_to_host(fed.inputs.data(), inputs.as<void>(), inputs.bytes());
  memory.copy_to_host(fed.labels.data(), labels.as<void>(), labels.bytes());
  return fed;
}

TEST(SampleFeed, ReadsAheadOnAnotherThreadTheSamplesItWouldReadAtOnce) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  RecordingDataset dataset(true);
  SampleFeed feed(dataset, *memory, {.inputs = true, .labels = true});
  ASSERT_TRUE(feed.reads_ahead());
  const Fed first = feed_through(feed, *memory, {4, 7});
  EXPECT_EQ(first.inputs, (std::vector<float>{40, 41, 70, 71}));
  EXPECT_EQ(first.labels, (std::vector<std::int32_t>{1, 1}));
  feed.read_ahead(Split::train, {5, 9});
  const Fed second = feed_through(feed, *memory, {5, 9});
  EXPECT_EQ(second.inputs, (std::vector<float>{50, 51, 90, 91}));
  EXPECT_EQ(second.labels, (std::vector<std::int32_t>{2, 0}));
  ASSERT_EQ(dataset.readers.size(), 2u);  // the second read took the read ahead
  EXPECT_EQ(dataset.readers[0], std::this_thread::get_id());
  EXPECT_NE(dataset.readers[1], std::this_thread::get_id());
  // A read ahead of other samples is not used: those asked for are read at once.
  feed.read_ahead(Split::train, {1, 2});
  EXPECT_EQ(feed_through(feed, *memory, {3, 6}).inputs, (std::vector<float>{30, 31, 60, 61}));
  EXPECT_EQ(dataset.readers.size(), 4u);
  EXPECT_FALSE(feed.problem());
}

TEST(SampleFeed, ReadsAtOnceOnTheCpuOrWhenTheDatasetKeepsToOneThread) {
  MemoryLedger ledger;
  auto loopback = make_loopback_allocator(ledger);
  RecordingDataset one_thread(false);
  EXPECT_FALSE(SampleFeed(one_thread, *loopback, {.inputs = true}).reads_ahead());
  HostAllocator host(ledger);
  RecordingDataset any_thread(true);
  SampleFeed feed(any_thread, host, {.inputs = true, .labels = true});
  EXPECT_FALSE(feed.reads_ahead());
  feed.read_ahead(Split::train, {1});
  EXPECT_EQ(feed_through(feed, host, {8}).inputs, (std::vector<float>{80, 81}));
  EXPECT_EQ(any_thread.readers.size(), 1u);
  // A rank that reads no part of a sample (a middle pipeline stage) does not read at all.
  SampleFeed none(any_thread, *loopback, {});
  EXPECT_FALSE(none.reads_ahead());
  none.read(Split::train, {1, 2}, {nullptr, nullptr, nullptr});
  EXPECT_EQ(any_thread.readers.size(), 1u);
}

TEST(SampleFeed, AFailedReadGivesZerosAndAProblem) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  RecordingDataset dataset(true);
  SampleFeed feed(dataset, *memory, {.inputs = true, .labels = true});
  feed.read_ahead(Split::train, {2, -1});
  const Fed fed = feed_through(feed, *memory, {2, -1});
  EXPECT_EQ(fed.inputs, std::vector<float>(4, 0.0f));
  EXPECT_EQ(fed.labels, std::vector<std::int32_t>(2, 0));
  ASSERT_TRUE(feed.problem());
  EXPECT_EQ(*feed.problem(), "sample -1 is unreadable");
}

}  // namespace
