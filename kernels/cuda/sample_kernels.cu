// The built-in datasets generated on the GPU (core/builtin_samples.hpp), the CPU's samples bit
// for bit: each thread calls the inline functions the host's loops call. Compiled with
// -fmad=false (kernels/meson.build) so that nvcc fuses no product the host leaves unfused.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/sample_kernels.hpp"

namespace mlptrain {

namespace {

constexpr int threads_per_block = 256;

// A sample's label (mixture), for the inputs kernel to read once per element.
__global__ void synthetic_labels_kernel(SyntheticSamples samples, const std::uint64_t* stream_indices,
                                        std::int64_t count, std::int32_t* labels) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    labels[i] = synthetic_label(samples, stream_indices[i]);
}

// Every input element; a mixture's reads its sample's label.
__global__ void synthetic_inputs_kernel(SyntheticSamples samples, const std::uint64_t* stream_indices,
                                        std::int64_t count, const std::int32_t* labels, float* inputs) {
  const std::int64_t columns = samples.input_dim;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count * columns;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t sample = i / columns, column = i % columns;
    const std::int32_t label = labels != nullptr ? labels[sample] : 0;
    inputs[i] = synthetic_input(samples, stream_indices[sample], column, label);
  }
}

// The teacher's targets, a block of 64 threads (its hidden units) per sample: each thread sums its
// unit over the inputs in order, then the block's threads share out the targets.
__global__ void teacher_targets_kernel(SyntheticSamples samples, std::int64_t count, const float* inputs,
                                       float* targets) {
  __shared__ float hidden[teacher_hidden_units];
  for (std::int64_t sample = blockIdx.x; sample < count; sample += gridDim.x) {
    hidden[threadIdx.x] = teacher_hidden(samples, inputs + sample * samples.input_dim, threadIdx.x);
    __syncthreads();
    for (std::int64_t output = threadIdx.x; output < samples.output_dim; output += blockDim.x)
      targets[sample * samples.output_dim + output] = teacher_target(samples, hidden, output);
    __syncthreads();  // before the next sample overwrites the hidden units
  }
}

int blocks_for(std::int64_t work, std::int64_t per_block) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

}  // namespace

void launch_builtin_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::int64_t count,
                              float* inputs, float* targets, std::int32_t* labels, const SampleScratch& scratch,
                              cudaStream_t stream) {
  if (count <= 0) return;
  const bool teacher = samples.kind == SyntheticKind::teacher;
  const bool wants_inputs = inputs != nullptr || (teacher && targets != nullptr);
  std::int32_t* sample_labels = nullptr;
  if (!teacher && (labels != nullptr || wants_inputs)) {
    sample_labels = labels != nullptr ? labels : scratch.labels;
    synthetic_labels_kernel<<<blocks_for(count, threads_per_block), threads_per_block, 0, stream>>>(
        samples, stream_indices, count, sample_labels);
    check(cudaGetLastError(), "synthetic_labels_kernel launch");
  }
  if (!wants_inputs) return;
  float* rows = inputs != nullptr ? inputs : scratch.inputs;
  synthetic_inputs_kernel<<<blocks_for(count * samples.input_dim, threads_per_block), threads_per_block, 0, stream>>>(
      samples, stream_indices, count, sample_labels, rows);
  check(cudaGetLastError(), "synthetic_inputs_kernel launch");
  if (!teacher || targets == nullptr) return;
  teacher_targets_kernel<<<blocks_for(count, 1), static_cast<unsigned>(teacher_hidden_units), 0, stream>>>(
      samples, count, rows, targets);
  check(cudaGetLastError(), "teacher_targets_kernel launch");
}

}  // namespace mlptrain
