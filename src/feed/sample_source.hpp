// Where a rank's micro-batches get their samples: read on the host and copied where the model
// takes them (sample_feed.hpp), or generated on the device itself (device_samples.hpp).
#pragma once

#include <array>
#include <cstdint>
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

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Puts the samples `indices` of `split` into `destination` (inputs, targets, labels: the parts
  // this rank reads; a null or empty buffer is not wanted).
  virtual void read(Split split, const std::vector<std::int64_t>& indices,
                    const std::array<Buffer*, 3>& destination) = 0;
  // Starts reading `indices` of `split` ahead, for a coming read, after those started before (a
  // no-op where nothing is read ahead).
  virtual void read_ahead(Split /*split*/, std::vector<std::int64_t> /*indices*/) {}
  // How many batches may be read ahead at once (0: none are).
  virtual int batches_ahead() const { return 0; }
  // Waits for reads ahead in flight (before the caller's own use of the HDF5 library).
  virtual void finish_reads() {}
  // The first read problem met (a read that failed gave zeros).
  virtual const std::optional<std::string>& problem() const = 0;
};

}  // namespace mlptrain
