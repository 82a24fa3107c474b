// The built-in datasets' samples generated on the host (see builtin_samples.hpp), with the same
// inline functions as a device's kernel, a row at a time so that the loops vectorize. The teacher's
// sums run with the summed index outside and the sums inside (vectorized over the hidden units,
// then over the outputs): each sum still adds its terms in the order teacher_hidden and
// teacher_target add them.
#include "core/builtin_samples.hpp"

#include <vector>

namespace mlptrain {

void generate_builtin_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::size_t count,
                                float* inputs, float* targets, std::int32_t* labels) {
  const std::int64_t in = samples.input_dim, out = samples.output_dim;
  const bool teacher = samples.kind == SyntheticKind::teacher;
  const bool wants_row = inputs != nullptr || (teacher && targets != nullptr);
  // The teacher's targets need the inputs even where the caller does not take them.
  std::vector<float> scratch_row(inputs == nullptr && wants_row ? static_cast<std::size_t>(in) : 0);
  float hidden[teacher_hidden_units];
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t index = stream_indices[i];
    const std::int32_t label = teacher ? 0 : synthetic_label(samples, index);
    if (!teacher && labels != nullptr) labels[i] = label;
    if (!wants_row) continue;
    float* row = inputs != nullptr ? inputs + i * in : scratch_row.data();
    // synthetic_input, as two loops that vectorize: the normal values, then a mixture's means.
    const counter_stream::Key key = samples.inputs_key;
    for (std::int64_t column = 0; column < in; ++column) row[column] = synthetic_normal(key, in, index, column);
    if (!teacher) {
      const float* mean = samples.first_table + label * in;
      for (std::int64_t column = 0; column < in; ++column) row[column] += mean[column];
    }
    if (!teacher || targets == nullptr) continue;
    for (float& unit : hidden) unit = 0.0f;
    for (std::int64_t column = 0; column < in; ++column) {
      const float* weights = samples.first_table + column * teacher_hidden_units;
      for (std::int64_t unit = 0; unit < teacher_hidden_units; ++unit)
        hidden[unit] = counter_stream::fused(weights[unit], row[column], hidden[unit]);
    }
    for (float& unit : hidden) unit = counter_stream::tanh(unit);
    // teacher_target for every output at once: each output's terms added in unit order.
    float* row_targets = targets + i * out;
    for (std::int64_t output = 0; output < out; ++output) row_targets[output] = 0.0f;
    for (std::int64_t unit = 0; unit < teacher_hidden_units; ++unit) {
      const float* weights = samples.second_table + unit * out;
      for (std::int64_t output = 0; output < out; ++output)
        row_targets[output] = counter_stream::fused(weights[output], hidden[unit], row_targets[output]);
    }
  }
}

}  // namespace mlptrain
