// Datasets: a sample is a row of inputs and either a row of float targets (regression) or an
// integer label (classification), addressed by its index in the train or the test split.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/config.hpp"
#include "core/builtin_samples.hpp"

namespace mlptrain {

enum class TargetKind { regression, classification };
enum class Split { train, test };

struct DatasetInfo {
  std::string name;
  std::int64_t train_size = 0;
  std::int64_t test_size = 0;  // 0: no held-out split
  std::int64_t input_dim = 0;
  std::int64_t output_dim = 0;  // target columns, or classes
  TargetKind kind = TargetKind::regression;
  std::int64_t memory_bytes = 0;  // a file's arrays held in memory (0: generated, nothing held)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const DatasetInfo& info() const = 0;
  // Rows of the given samples, in the given order. Any output pointer may be null (not wanted).
  virtual void read(Split split, std::span<const std::int64_t> indices, float* inputs,
                    float* targets, std::int32_t* labels) = 0;
  // Whether reads may run on any thread, several at once on disjoint outputs (not through the
  // HDF5 library, which is not built thread-safe and which checkpoints use on the main thread
  // meanwhile).
  virtual bool readable_from_any_thread() const { return false; }
  // Whether reads go to a file: worth reading ahead on another thread even where reads may not
  // run on any thread (then one read at a time, beside no HDF5 call of the main thread's).
  virtual bool reads_from_file() const { return false; }
  // A built-in dataset's generator (its tables in host memory), which a device can run where it
  // trains; none for a file.
  virtual std::optional<SyntheticSamples> synthetic() const { return std::nullopt; }
};

// The index of a sample in its generator's streams: the test split's lie beyond every training
// index, so the splits never overlap.
std::uint64_t synthetic_stream_index(Split split, std::int64_t sample);

// Whether a file's arrays are held in memory under `cap_bytes` (generated data never is).
inline bool held_in_memory(const DatasetInfo& info, std::int64_t cap_bytes) {
  return info.memory_bytes > 0 && info.memory_bytes <= cap_bytes;
}

struct DataOptions {
  DatasetKind kind = DatasetKind::teacher;
  std::string path;  // hdf5 only
  std::int64_t input_dim = 0;   // 0: the dataset's default
  std::int64_t output_dim = 0;  // 0: the dataset's default
  std::int64_t memory_cap_bytes = 0;  // hdf5: held in memory when it fits (0: read each batch)
};

// Throws UsageError for a missing or malformed file, or dimensions that contradict the file.
std::unique_ptr<Dataset> open_dataset(const DataOptions& options);

// The built-in generators (builtin_datasets.cpp) and the file reader (hdf5_dataset.cpp).
std::unique_ptr<Dataset> make_teacher_dataset(std::int64_t input_dim, std::int64_t output_dim);
std::unique_ptr<Dataset> make_mixture_dataset(std::int64_t input_dim, std::int64_t classes);
std::unique_ptr<Dataset> open_hdf5_dataset(const DataOptions& options);

}  // namespace mlptrain
