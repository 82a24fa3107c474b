// The built-in datasets (core/builtin_samples.hpp), generated from the sample index alone (no
// files, any slice on its own). Both have fixed train and test sizes and a fixed generator seed,
// so the data never depends on --seed.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/builtin_samples.hpp"
#include "data/dataset.hpp"

namespace mlptrain {

namespace {

constexpr std::int64_t builtin_train_size = 65536;
constexpr std::int64_t builtin_test_size = 8192;
constexpr std::uint64_t data_seed = 20261121;

// A built-in dataset over its generator's tables (kept here, in host memory).
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(DatasetInfo info, SyntheticSamples samples, std::vector<float> first_table,
                   std::vector<float> second_table)
      : info_(std::move(info)),
        samples_(samples),
        first_table_(std::move(first_table)),
        second_table_(std::move(second_table)) {
    samples_.first_table = first_table_.data();
    samples_.second_table = second_table_.empty() ? nullptr : second_table_.data();
  }

  const DatasetInfo& info() const override { return info_; }
  bool readable_from_any_thread() const override { return true; }  // a pure function of the index
  std::optional<SyntheticSamples> synthetic() const override { return samples_; }

  void read(Split split, std::span<const std::int64_t> indices, float* inputs, float* targets,
            std::int32_t* labels) override {
    std::vector<std::uint64_t> stream_indices(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) stream_indices[i] = synthetic_stream_index(split, indices[i]);
    generate_builtin_samples(samples_, stream_indices.data(), stream_indices.size(), inputs, targets, labels);
  }

 private:
  DatasetInfo info_;
  SyntheticSamples samples_;
  std::vector<float> first_table_;
  std::vector<float> second_table_;
};

std::vector<float> normal_table(std::string_view name, std::size_t count, float stddev) {
  std::vector<float> table(count);
  CounterRng(data_seed, name).fill_normal(table.data(), 0, count, 0.0f, stddev);
  return table;
}

// A [rows, cols] table transposed.
std::vector<float> transposed(const std::vector<float>& table, std::size_t rows, std::size_t cols) {
  std::vector<float> result(table.size());
  for (std::size_t row = 0; row < rows; ++row)
    for (std::size_t col = 0; col < cols; ++col) result[col * rows + row] = table[row * cols + col];
  return result;
}

}  // namespace

std::uint64_t synthetic_stream_index(Split split, std::int64_t sample) {
  return static_cast<std::uint64_t>(sample) + (split == Split::test ? (1ull << 40) : 0);
}

std::unique_ptr<Dataset> make_teacher_dataset(std::int64_t input_dim, std::int64_t output_dim) {
  const SyntheticSamples samples{.kind = SyntheticKind::teacher, .input_dim = input_dim, .output_dim = output_dim,
                                 .inputs_key = CounterRng(data_seed, "teacher/x").key()};
  // Variance-preserving scales keep the targets of order one at any width.
  return std::make_unique<SyntheticDataset>(
      DatasetInfo{"teacher", builtin_train_size, builtin_test_size, input_dim, output_dim, TargetKind::regression},
      samples,
      normal_table("teacher/w1", static_cast<std::size_t>(input_dim * teacher_hidden_units),
                   1.0f / std::sqrt(static_cast<float>(input_dim))),
      // W2 [output_dim, 64] as drawn, kept transposed (builtin_samples.hpp).
      transposed(normal_table("teacher/w2", static_cast<std::size_t>(output_dim * teacher_hidden_units),
                              1.0f / std::sqrt(static_cast<float>(teacher_hidden_units))),
                 static_cast<std::size_t>(output_dim), teacher_hidden_units));
}

std::unique_ptr<Dataset> make_mixture_dataset(std::int64_t input_dim, std::int64_t classes) {
  const SyntheticSamples samples{.kind = SyntheticKind::mixture, .input_dim = input_dim, .output_dim = classes,
                                 .inputs_key = CounterRng(data_seed, "mixture/x").key(),
                                 .labels_key = CounterRng(data_seed, "mixture/label").key()};
  // Means spread so that neighbouring components overlap: the task is learnable, not trivial.
  return std::make_unique<SyntheticDataset>(
      DatasetInfo{"mixture", builtin_train_size, builtin_test_size, input_dim, classes,
                  TargetKind::classification},
      samples,
      normal_table("mixture/means", static_cast<std::size_t>(classes * input_dim),
                   2.0f / std::sqrt(static_cast<float>(input_dim))),
      std::vector<float>{});
}

std::unique_ptr<Dataset> open_dataset(const DataOptions& options) {
  switch (options.kind) {
    case DatasetKind::teacher:
      return make_teacher_dataset(options.input_dim > 0 ? options.input_dim : 32,
                                  options.output_dim > 0 ? options.output_dim : 4);
    case DatasetKind::mixture:
      return make_mixture_dataset(options.input_dim > 0 ? options.input_dim : 32,
                                  options.output_dim > 0 ? options.output_dim : 10);
    case DatasetKind::hdf5: return open_hdf5_dataset(options);
  }
  throw std::logic_error("unknown dataset kind");
}

}  // namespace mlptrain
