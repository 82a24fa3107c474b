// Train room: the sample feed reads the same samples whether it reads ahead or not, reads ahead
// on another thread where the rank has a reader thread (on the CPU, a core its GEMMs leave free)
// and the dataset allows it or is a file, keeps two batches ahead and uploads them through
// alternating slots, splits a batch over its reader threads, falls back to reading at once when
// the read ahead was for other samples, and turns a failed read into zeros and a problem. The
// built-in datasets generated on a device (the loopback device here) are the CPU's samples bit
// for bit.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/memory_ledger.hpp"
#include "kernels/loopback/loopback_backend.hpp"
#include "feed/device_samples.hpp"
#include "feed/sample_feed.hpp"

using namespace mlptrain;

namespace {

// Sample i's inputs are i * 10 + column, its label i % 3; records which thread read what.
class RecordingDataset final : public Dataset {
 public:
  explicit RecordingDataset(bool any_thread, bool from_file = false)
      : any_thread_(any_thread), from_file_(from_file) {}
  const DatasetInfo& info() const override { return info_; }
  bool readable_from_any_thread() const override { return any_thread_; }
  bool reads_from_file() const override { return from_file_; }
  void read(Split, std::span<const std::int64_t> indices, float* inputs, float*,
            std::int32_t* labels) override {
    {
      const std::lock_guard lock(mutex_);
      readers.push_back(std::this_thread::get_id());
      asked_inputs.push_back(inputs != nullptr);
    }
    for (std::size_t row = 0; row < indices.size(); ++row) {
      if (indices[row] < 0) throw RuntimeFailure("sample " + std::to_string(indices[row]) + " is unreadable");
      for (int column = 0; column < 2; ++column)
        if (inputs != nullptr) inputs[row * 2 + column] = static_cast<float>(indices[row] * 10 + column);
      if (labels != nullptr) labels[row] = static_cast<std::int32_t>(indices[row] % 3);
    }
  }
  std::vector<std::thread::id> readers;
  std::vector<bool> asked_inputs;

 private:
  DatasetInfo info_{"recording", 100, 0, 2, 3, TargetKind::classification};
  bool any_thread_, from_file_;
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
  SampleFeed feed(dataset, *memory, {.inputs = true, .labels = true}, 1);
  ASSERT_EQ(feed.batches_ahead(), 2);
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

TEST(SampleFeed, ReadsAtOnceWithoutAFreeCoreOrWhenTheDatasetKeepsToOneThread) {
  MemoryLedger ledger;
  auto loopback = make_loopback_allocator(ledger);
  RecordingDataset one_thread(false);
  EXPECT_EQ(SampleFeed(one_thread, *loopback, {.inputs = true}, 1).batches_ahead(), 0);
  HostAllocator host(ledger);
  RecordingDataset any_thread(true);
  SampleFeed feed(any_thread, host, {.inputs = true, .labels = true}, 0);  // the GEMMs use every core
  EXPECT_EQ(feed.batches_ahead(), 0);
  feed.read_ahead(Split::train, {1});
  EXPECT_EQ(feed_through(feed, host, {8}).inputs, (std::vector<float>{80, 81}));
  EXPECT_EQ(any_thread.readers.size(), 1u);
  // A rank that reads no part of a sample (a middle pipeline stage) does not read at all.
  SampleFeed none(any_thread, *loopback, {}, 1);
  EXPECT_EQ(none.batches_ahead(), 0);
  none.read(Split::train, {1, 2}, {nullptr, nullptr, nullptr});
  EXPECT_EQ(any_thread.readers.size(), 1u);
}

TEST(SampleFeed, ReadsAheadOnTheCpuWhereACoreIsFree) {
  MemoryLedger ledger;
  HostAllocator host(ledger);
  RecordingDataset any_thread(true);
  SampleFeed feed(any_thread, host, {.inputs = true, .labels = true}, 1);
  ASSERT_EQ(feed.batches_ahead(), 2);
  feed.read_ahead(Split::train, {5});
  EXPECT_EQ(feed_through(feed, host, {5}).inputs, (std::vector<float>{50, 51}));
  ASSERT_EQ(any_thread.readers.size(), 1u);
  EXPECT_NE(any_thread.readers[0], std::this_thread::get_id());
  // A read of other samples than those read ahead (a V's loss chunk reading its labels alone)
  // reads only the parts asked for.
  feed.read_ahead(Split::train, {6});
  Buffer labels = host.allocate(MemoryState::activations, sizeof(std::int32_t));
  feed.read(Split::train, {4}, {nullptr, nullptr, &labels});
  EXPECT_EQ(*labels.as<std::int32_t>(), 1);
  ASSERT_EQ(any_thread.asked_inputs, (std::vector<bool>{true, true, false}));
}

TEST(SampleFeed, AFailedReadGivesZerosAndAProblem) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  RecordingDataset dataset(true);
  SampleFeed feed(dataset, *memory, {.inputs = true, .labels = true}, 1);
  feed.read_ahead(Split::train, {2, -1});
  const Fed fed = feed_through(feed, *memory, {2, -1});
  EXPECT_EQ(fed.inputs, std::vector<float>(4, 0.0f));
  EXPECT_EQ(fed.labels, std::vector<std::int32_t>(2, 0));
  ASSERT_TRUE(feed.problem());
  EXPECT_EQ(*feed.problem(), "sample -1 is unreadable");
}

TEST(SampleFeed, ReadsAFileAheadOnTheCpuWhereACoreIsFree) {
  MemoryLedger ledger;
  HostAllocator host(ledger);
  RecordingDataset file(false, true);
  EXPECT_EQ(SampleFeed(file, host, {.inputs = true}, 0).batches_ahead(), 0);  // the GEMMs use every core
  SampleFeed feed(file, host, {.inputs = true, .labels = true}, 4);
  ASSERT_EQ(feed.batches_ahead(), 2);
  std::vector<std::int64_t> many(40);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<std::int64_t>(i);
  feed.read_ahead(Split::train, many);
  const Fed fed = feed_through(feed, host, many);
  EXPECT_EQ(fed.inputs[2 * 39 + 1], 391.0f);
  ASSERT_EQ(file.readers.size(), 1u);  // one read at a time: the file's library is not thread-safe
  EXPECT_NE(file.readers[0], std::this_thread::get_id());
}

TEST(SampleFeed, SplitsABatchOverItsReaderThreadsWhereTheDatasetAllows) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  RecordingDataset dataset(true);
  SampleFeed feed(dataset, *memory, {.inputs = true, .labels = true}, 3);
  std::vector<std::int64_t> indices(60);
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::int64_t>((i * 7) % 100);
  feed.read_ahead(Split::train, indices);
  const Fed fed = feed_through(feed, *memory, indices);
  for (std::size_t i = 0; i < indices.size(); ++i) {
    EXPECT_EQ(fed.inputs[2 * i + 1], static_cast<float>(indices[i] * 10 + 1));
    EXPECT_EQ(fed.labels[i], indices[i] % 3);
  }
  EXPECT_EQ(dataset.readers.size(), 3u);
  // One slice fails: the whole batch is zeros and the problem is that slice's.
  indices[50] = -4;
  feed.read_ahead(Split::train, indices);
  const Fed failed = feed_through(feed, *memory, indices);
  EXPECT_EQ(failed.inputs, std::vector<float>(indices.size() * 2, 0.0f));
  ASSERT_TRUE(feed.problem());
  EXPECT_EQ(*feed.problem(), "sample -4 is unreadable");
}

TEST(SampleFeed, KeepsTwoBatchesAheadAndTakesThemInOrderThroughAlternatingSlots) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  RecordingDataset file(false, true);
  SampleFeed feed(file, *memory, {.inputs = true, .labels = true}, 1);
  ASSERT_EQ(feed.batches_ahead(), 2);
  feed.read_ahead(Split::train, {1, 2});
  feed.read_ahead(Split::train, {3, 4});
  // Five reads cycle both upload slots more than once; each takes its own batch.
  for (std::int64_t first = 1; first <= 9; first += 2) {
    EXPECT_EQ(feed_through(feed, *memory, {first, first + 1}).inputs,
              (std::vector<float>{first * 10.0f, first * 10.0f + 1, (first + 1) * 10.0f, (first + 1) * 10.0f + 1}));
    feed.read_ahead(Split::train, {first + 4, first + 5});
  }
  feed.finish_reads();
  EXPECT_EQ(file.readers.size(), 7u);  // every batch read once, none at once
  for (std::thread::id reader : file.readers) EXPECT_NE(reader, std::this_thread::get_id());
  // A read of a later batch drops those queued before it.
  EXPECT_EQ(feed_through(feed, *memory, {13, 14}).labels, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(file.readers.size(), 7u);
}

// The samples a dataset reads on the host, and those the device generates for the same indices.
struct Generated {
  std::vector<float> inputs, targets;
  std::vector<std::int32_t> labels;
};

Generated generate_on_device(Dataset& dataset, Split split, const std::vector<std::int64_t>& indices, SampleParts parts) {
  MemoryLedger ledger;
  auto memory = make_loopback_allocator(ledger);
  auto kernels = make_loopback_kernels();
  DeviceSamples samples(*dataset.synthetic(), *kernels, *memory, parts);
  const DatasetInfo& info = dataset.info();
  const std::size_t rows = indices.size();
  Buffer inputs = memory->allocate_floats(MemoryState::activations, rows * static_cast<std::size_t>(info.input_dim));
  Buffer targets = memory->allocate_floats(MemoryState::activations, rows * static_cast<std::size_t>(info.output_dim));
  Buffer labels = memory->allocate(MemoryState::activations, rows * sizeof(std::int32_t));
  Generated generated{std::vector<float>(rows * static_cast<std::size_t>(info.input_dim), -1.0f),
                      std::vector<float>(rows * static_cast<std::size_t>(info.output_dim), -1.0f),
                      std::vector<std::int32_t>(rows, -1)};
  memory->copy_to_device(inputs.as<void>(), generated.inputs.data(), inputs.bytes());
  memory->copy_to_device(targets.as<void>(), generated.targets.data(), targets.bytes());
  memory->copy_to_device(labels.as<void>(), generated.labels.data(), labels.bytes());
  samples.read(split, indices, {&inputs, &targets, &labels});
  memory->copy_to_host(generated.inputs.data(), inputs.as<void>(), inputs.bytes());
  memory->copy_to_host(generated.targets.data(), targets.as<void>(), targets.bytes());
  memory->copy_to_host(generated.labels.data(), labels.as<void>(), labels.bytes());
  return generated;
}

TEST(DeviceSamples, GeneratesTheSamplesTheDatasetReadsBitForBit) {
  const std::vector<std::int64_t> indices = {0, 7, 65535, 12, 12, 40000};
  for (DatasetKind kind : {DatasetKind::teacher, DatasetKind::mixture}) {
    auto dataset = open_dataset({.kind = kind, .input_dim = 37, .output_dim = 5});
    const DatasetInfo& info = dataset->info();
    const bool teacher = kind == DatasetKind::teacher;
    for (Split split : {Split::train, Split::test}) {
      Generated read{std::vector<float>(indices.size() * static_cast<std::size_t>(info.input_dim)),
                     std::vector<float>(indices.size() * static_cast<std::size_t>(info.output_dim), -1.0f),
                     std::vector<std::int32_t>(indices.size(), -1)};
      dataset->read(split, indices, read.inputs.data(), teacher ? read.targets.data() : nullptr,
                    teacher ? nullptr : read.labels.data());
      const Generated made = generate_on_device(*dataset, split, indices,
                                                {.inputs = true, .targets = teacher, .labels = !teacher});
      EXPECT_EQ(made.inputs, read.inputs);
      EXPECT_EQ(made.targets, read.targets);
      EXPECT_EQ(made.labels, read.labels);
      // A rank that computes the loss without the inputs (a pipeline's last stage) gets the same
      // targets or labels, and its inputs buffer is left alone.
      const Generated loss_side = generate_on_device(*dataset, split, indices, {.targets = teacher, .labels = !teacher});
      EXPECT_EQ(loss_side.targets, read.targets);
      EXPECT_EQ(loss_side.labels, read.labels);
      EXPECT_EQ(loss_side.inputs, std::vector<float>(read.inputs.size(), -1.0f));
    }
  }
}

}  // namespace
