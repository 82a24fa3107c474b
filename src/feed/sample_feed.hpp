// Feeds samples read on the host to micro-batches: the rank's inputs, targets or labels, read from
// the dataset into the buffers where the model takes them.
// - Off the CPU the samples travel through page-locked host slots and go up on the device's copy
//   engine (its background copier), ordered before the computation that reads them, so the host
//   never waits for the device to take a batch; up to `depth` batches are read ahead on a host
//   thread while the device computes: reading a batch can take as long as a GPU's step.
// - On the CPU the same holds where the rank has a core its GEMMs leave free (reading a file
//   can cost much more than a step's share); with none, samples are read straight into the
//   buffers.
// A file is read one read at a time: the main thread waits for the reads (finish_reads) before
// it uses the HDF5 library itself, which is not built thread-safe. A batch is read by the rank's
// reader threads, each a slice of its samples, where the dataset allows it. A read that fails
// gives zeros and a problem the trainer reports once every rank agrees.
// (The built-in datasets on a device are generated there instead: device_samples.hpp.)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.hpp"
#include "core/memory_ledger.hpp"
#include "data/dataset.hpp"
#include "feed/sample_source.hpp"

namespace mlptrain {

class SampleFeed final : public SampleSource {
 public:
  // Batches read ahead at most (being read, or read and not yet taken).
  static constexpr std::size_t depth = 2;

  // `memory` holds the buffers reads fill. Reading ahead needs a reader thread (a core the
  // rank's computation leaves free) and a dataset that may be read from another thread or one
  // read from a file; reading on several of the `reader_threads` needs a dataset that may be
  // read from several at once.
  SampleFeed(Dataset& dataset, Allocator& memory, SampleParts parts, int reader_threads);
  ~SampleFeed() override;  // waits for the reads and uploads in flight
  SampleFeed(const SampleFeed&) = delete;
  SampleFeed& operator=(const SampleFeed&) = delete;

  // Takes the samples from the batches read ahead when one holds them (those read ahead before
  // it are dropped), else reads them at once.
  void read(Split split, const std::vector<std::int64_t>& indices,
            const std::array<Buffer*, 3>& destination) override;
  // Queues a batch to read ahead, after those queued (a no-op where the feed does not read ahead).
  void read_ahead(Split split, std::vector<std::int64_t> indices) override;
  int batches_ahead() const override { return reads_ahead_ ? static_cast<int>(depth) : 0; }
  void finish_reads() override;
  const std::optional<std::string>& problem() const override { return problem_; }

 private:
  struct Batch {
    Split split = Split::train;
    std::vector<std::int64_t> indices;
    std::array<Buffer, 3> parts;  // inputs, targets, labels, in host memory (page-locked off the CPU)
    std::optional<std::string> problem;
  };
  struct Pending {
    std::shared_ptr<Batch> batch;
    std::shared_future<void> read;
  };
  // Uploads alternate between two slots, so a batch's copies run while the next is taken; each
  // slot has a copier lane per part.
  static constexpr int upload_slots = 2;

  // Reads `indices` into the three parts' memory (null: not read); a failure fills zeros and
  // returns what went wrong.
  std::optional<std::string> fill(Split split, const std::vector<std::int64_t>& indices,
                                  const std::array<void*, 3>& parts) const;
  // Reads the batch's samples into its parts that are read and `wanted`, in host memory.
  void fill(Batch& batch, const std::array<bool, 3>& wanted) const;
  // Puts the batch's parts into the destination's: uploaded through the slots off the CPU,
  // copied on it.
  void deliver(const std::shared_ptr<Batch>& batch, const std::array<void*, 3>& destination);
  Allocator& host_memory() { return copier_ ? copier_->host_memory() : own_host_memory_; }

  Dataset& dataset_;
  Allocator& memory_;
  std::array<std::size_t, 3> bytes_per_sample_{};  // 0: the part is not read
  bool reads_nothing_ = false;
  bool reads_ahead_ = false;
  int reader_threads_ = 1;
  std::unique_ptr<AsyncCopier> copier_;  // off the CPU: the uploads
  MemoryLedger own_ledger_;              // a batch's host memory on the CPU, not the device's
  HostAllocator own_host_memory_{own_ledger_};
  std::deque<Pending> ahead_;
  std::array<std::shared_ptr<Batch>, upload_slots> uploading_;  // kept until the slot's copies end
  int next_slot_ = 0;
  std::optional<std::string> problem_;
};

}  // namespace mlptrain
