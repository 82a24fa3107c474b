// The built-in datasets' samples as pure functions of a sample's stream index, written once for
// the host and a device (core/counter_stream.hpp says how the two give the same bits): `teacher`
// regresses the outputs of a fixed random two-layer tanh network on standard normal inputs;
// `mixture` classifies samples of a Gaussian mixture with one component per class. The data room
// wraps them as datasets; a device's kernels generate them where the run trains, so a GPU never
// waits for the host to make its batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/counter_stream.hpp"

namespace mlptrain {

enum class SyntheticKind { teacher, mixture };

// The teacher network's hidden units.
inline constexpr std::int64_t teacher_hidden_units = 64;

// One built-in dataset as its generator needs it: the streams' keys and the fixed tables, in
// the memory of whoever generates (the host's, or a device's copy).
struct SyntheticSamples {
  SyntheticKind kind = SyntheticKind::teacher;
  std::int64_t input_dim = 0;
  std::int64_t output_dim = 0;          // teacher: target columns; mixture: classes
  counter_stream::Key inputs_key;       // the inputs' normal values (teacher) or noise (mixture)
  counter_stream::Key labels_key;       // mixture: the labels
  const float* first_table = nullptr;   // teacher: W1 [input_dim, 64]; mixture: means [classes, input_dim]
  const float* second_table = nullptr;  // teacher: W2 transposed, [64, output_dim]
};

// The label of the sample at `stream_index` (mixture).
MLPTRAIN_HOST_DEVICE inline std::int32_t synthetic_label(const SyntheticSamples& samples, std::uint64_t stream_index) {
  return static_cast<std::int32_t>(counter_stream::below(counter_stream::words(samples.labels_key, stream_index),
                                                         static_cast<std::uint64_t>(samples.output_dim)));
}

// The standard normal value behind input `column` of the sample at `stream_index`: the input
// itself (teacher), or its noise around its class's mean (mixture).
MLPTRAIN_HOST_DEVICE inline float synthetic_normal(counter_stream::Key key, std::int64_t input_dim,
                                                   std::uint64_t stream_index, std::int64_t column) {
  const auto element = stream_index * static_cast<std::uint64_t>(input_dim) + static_cast<std::uint64_t>(column);
  return counter_stream::normal(counter_stream::words(key, element));
}

// Input `column` of the sample at `stream_index`; `label` is the sample's (mixture; unused by
// teacher), so a row's columns need it drawn once.
MLPTRAIN_HOST_DEVICE inline float synthetic_input(const SyntheticSamples& samples, std::uint64_t stream_index,
                                                  std::int64_t column, std::int32_t label) {
  const float value = synthetic_normal(samples.inputs_key, samples.input_dim, stream_index, column);
  if (samples.kind == SyntheticKind::teacher) return value;
  return value + samples.first_table[label * samples.input_dim + column];
}

// Hidden unit `unit` of the teacher on an input row: tanh of the sum over the inputs in order,
// each term added by an FMA.
MLPTRAIN_HOST_DEVICE inline float teacher_hidden(const SyntheticSamples& samples, const float* inputs, std::int64_t unit) {
  float sum = 0.0f;
  for (std::int64_t column = 0; column < samples.input_dim; ++column)
    sum = counter_stream::fused(samples.first_table[column * teacher_hidden_units + unit], inputs[column], sum);
  return counter_stream::tanh(sum);
}

// Target `output` of the teacher from its hidden units, summed in order by FMAs.
MLPTRAIN_HOST_DEVICE inline float teacher_target(const SyntheticSamples& samples, const float* hidden, std::int64_t output) {
  float sum = 0.0f;
  for (std::int64_t unit = 0; unit < teacher_hidden_units; ++unit)
    sum = counter_stream::fused(samples.second_table[unit * samples.output_dim + output], hidden[unit], sum);
  return sum;
}

// Generates `count` samples on the host: for each stream index its inputs row (if `inputs`) and
// its targets (teacher, if `targets`) or label (mixture, if `labels`).
void generate_builtin_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::size_t count,
                                float* inputs, float* targets, std::int32_t* labels);

}  // namespace mlptrain
