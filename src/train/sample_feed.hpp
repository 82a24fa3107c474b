// Feeds samples to micro-batches: the rank's inputs, targets or labels, read from the dataset
// into the buffers where the model takes them. Off the CPU they are read into host memory and
// copied to the device, and the next micro-batch's samples are read ahead on a host thread
// while the device computes: generating or reading a batch can take as long as a GPU's step.
// On the CPU the same holds where the rank has a core its GEMMs leave free (generating the
// built-in data is 1-2 % of a step, reading a file can be much more); with none, samples are
// read straight into the buffers. A file is read ahead one read at a time: the main thread
// waits for it (finish_reads) before it uses the HDF5 library itself, which is not built
// thread-safe.
// A batch read ahead is read by the rank's reader threads, each a slice of its samples, where
// the dataset allows it: generating a large batch on one core can take many times a GPU's step.
// A read that fails gives zeros and a problem the trainer reports once every rank agrees.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.hpp"
#include "data/dataset.hpp"

namespace mlptrain {

// Which parts of a sample this rank reads (inputs where the model starts, targets or labels
// where the loss is computed).
struct SampleParts {
  bool inputs = false;
  bool targets = false;
  bool labels = false;
};

class SampleFeed {
 public:
  // `memory` holds the buffers reads fill. Reading ahead needs a reader thread (a core the
  // rank's computation leaves free) and a dataset that may be read from another thread or one
  // read from a file; reading on several of the `reader_threads` needs a dataset that may be
  // read from several at once.
  SampleFeed(Dataset& dataset, Allocator& memory, SampleParts parts, int reader_threads);
  ~SampleFeed();  // waits for a read ahead in flight
  SampleFeed(const SampleFeed&) = delete;
  SampleFeed& operator=(const SampleFeed&) = delete;

  // Reads the samples `indices` of `split` into `destination` (inputs, targets, labels; the
  // parts this rank reads), taking them from the read ahead when it read the same ones.
  void read(Split split, const std::vector<std::int64_t>& indices,
            const std::array<Buffer*, 3>& destination);
  // Starts reading `indices` of `split` ahead, for the next read (a no-op where the feed does
  // not read ahead).
  void read_ahead(Split split, std::vector<std::int64_t> indices);
  bool reads_ahead() const { return reads_ahead_; }
  // Waits for a read ahead in flight (before the caller's own use of the HDF5 library).
  void finish_reads();

  // The first read problem met (a read that failed gave zeros).
  const std::optional<std::string>& problem() const { return problem_; }

 private:
  struct Batch {
    Split split = Split::train;
    std::vector<std::int64_t> indices;
    std::array<std::vector<std::byte>, 3> parts;  // inputs, targets, labels
    std::optional<std::string> problem;
  };
  // Reads `indices` into the three parts' memory (null: not read); a failure fills zeros and
  // returns what went wrong.
  std::optional<std::string> fill(Split split, const std::vector<std::int64_t>& indices,
                                  const std::array<void*, 3>& parts) const;
  // Reads the batch's samples into its parts that are read and `wanted`.
  void fill(Batch& batch, const std::array<bool, 3>& wanted) const;

  Dataset& dataset_;
  Allocator& memory_;
  std::array<std::size_t, 3> bytes_per_sample_{};  // 0: the part is not read
  bool reads_nothing_ = false;
  bool reads_ahead_ = false;
  int reader_threads_ = 1;
  std::optional<Batch> ahead_;
  std::future<void> ahead_done_;
  std::optional<std::string> problem_;
};

}  // namespace mlptrain
