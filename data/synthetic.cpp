// The built-in datasets, generated from the sample index alone (no files, any slice on its own):
// `teacher` regresses the outputs of a fixed random two-layer tanh network on standard normal
// inputs; `mixture` classifies samples of a Gaussian mixture with one component per class. Both
// have fixed train and test sizes and a fixed generator seed, so the data never depends on --seed.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/dataset.hpp"

namespace mlptrain {

namespace {

constexpr std::int64_t builtin_train_size = 65536;
constexpr std::int64_t builtin_test_size = 8192;
constexpr std::uint64_t data_seed = 20261121;
constexpr std::int64_t teacher_hidden = 64;

// The test split draws from indices beyond every train index, so the splits never overlap.
std::uint64_t stream_index(Split split, std::int64_t sample) {
  return static_cast<std::uint64_t>(sample) + (split == Split::test ? (1ull << 40) : 0);
}

class TeacherDataset final : public Dataset {
 public:
  TeacherDataset(std::int64_t input_dim, std::int64_t output_dim)
      : info_{"teacher", builtin_train_size, builtin_test_size, input_dim, output_dim,
              TargetKind::regression},
        inputs_(data_seed, "teacher/x"),
        first_weights_(static_cast<std::size_t>(input_dim * teacher_hidden)),  // [in, hidden]
        second_weights_(static_cast<std::size_t>(output_dim * teacher_hidden)) {
    // Variance-preserving scales keep the targets of order one at any width.
    CounterRng(data_seed, "teacher/w1")
        .fill_normal(first_weights_.data(), 0, first_weights_.size(), 0.0f,
                     1.0f / std::sqrt(static_cast<float>(input_dim)));
    CounterRng(data_seed, "teacher/w2")
        .fill_normal(second_weights_.data(), 0, second_weights_.size(), 0.0f,
                     1.0f / std::sqrt(static_cast<float>(teacher_hidden)));
  }

  const DatasetInfo& info() const override { return info_; }
  bool readable_from_any_thread() const override { return true; }  // a pure function of the index

  void read(Split split, std::span<const std::int64_t> indices, float* inputs, float* targets,
            std::int32_t*) override {
    const std::int64_t in = info_.input_dim, out = info_.output_dim;
    std::vector<float> row(static_cast<std::size_t>(in));
    std::vector<float> hidden(static_cast<std::size_t>(teacher_hidden));
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::uint64_t first = stream_index(split, indices[i]) * static_cast<std::uint64_t>(in);
      inputs_.fill_normal(row.data(), first, row.size(), 0.0f, 1.0f);
      if (inputs != nullptr) std::copy(row.begin(), row.end(), inputs + i * in);
      if (targets == nullptr) continue;
      // Accumulating over inputs with the hidden units innermost keeps the loop vectorizable.
      std::fill(hidden.begin(), hidden.end(), 0.0f);
      for (std::int64_t d = 0; d < in; ++d)
        for (std::int64_t h = 0; h < teacher_hidden; ++h)
          hidden[h] += first_weights_[d * teacher_hidden + h] * row[d];
      for (float& unit : hidden) unit = std::tanh(unit);
      for (std::int64_t o = 0; o < out; ++o) {
        float sum = 0;
        for (std::int64_t h = 0; h < teacher_hidden; ++h)
          sum += second_weights_[o * teacher_hidden + h] * hidden[h];
        targets[i * out + o] = sum;
      }
    }
  }

 private:
  DatasetInfo info_;
  CounterRng inputs_;
  std::vector<float> first_weights_;
  std::vector<float> second_weights_;
};

class MixtureDataset final : public Dataset {
 public:
  MixtureDataset(std::int64_t input_dim, std::int64_t classes)
      : info_{"mixture", builtin_train_size, builtin_test_size, input_dim, classes,
              TargetKind::classification},
        noise_(data_seed, "mixture/x"),
        labels_(data_seed, "mixture/label"),
        means_(static_cast<std::size_t>(classes * input_dim)) {
    // Means spread so that neighbouring components overlap: the task is learnable, not trivial.
    CounterRng(data_seed, "mixture/means")
        .fill_normal(means_.data(), 0, means_.size(), 0.0f,
                     2.0f / std::sqrt(static_cast<float>(input_dim)));
  }

  const DatasetInfo& info() const override { return info_; }
  bool readable_from_any_thread() const override { return true; }  // a pure function of the index

  void read(Split split, std::span<const std::int64_t> indices, float* inputs, float*,
            std::int32_t* labels) override {
    const std::int64_t in = info_.input_dim;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::uint64_t index = stream_index(split, indices[i]);
      const auto label = static_cast<std::int32_t>(
          labels_.below(index, static_cast<std::uint64_t>(info_.output_dim)));
      if (labels != nullptr) labels[i] = label;
      if (inputs == nullptr) continue;
      float* row = inputs + i * in;
      noise_.fill_normal(row, index * static_cast<std::uint64_t>(in), static_cast<std::size_t>(in),
                         0.0f, 1.0f);
      const float* mean = means_.data() + label * in;
      for (std::int64_t d = 0; d < in; ++d) row[d] += mean[d];
    }
  }

 private:
  DatasetInfo info_;
  CounterRng noise_;
  CounterRng labels_;
  std::vector<float> means_;
};

}  // namespace

std::unique_ptr<Dataset> make_teacher_dataset(std::int64_t input_dim, std::int64_t output_dim) {
  return std::make_unique<TeacherDataset>(input_dim, output_dim);
}

std::unique_ptr<Dataset> make_mixture_dataset(std::int64_t input_dim, std::int64_t classes) {
  return std::make_unique<MixtureDataset>(input_dim, classes);
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
