// The GPU's sample generator (sample_kernels.cu), for the CUDA kernels' generate_samples.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/builtin_samples.hpp"

namespace mlptrain {

// Device memory the generator may use for what the caller does not take: the inputs (count x
// input_dim floats) where teacher targets are wanted without them, the labels (count) where a
// mixture's inputs are wanted without them.
struct SampleScratch {
  float* inputs = nullptr;
  std::int32_t* labels = nullptr;
};

// Queues the generation of `count` samples on `stream` (see Kernels::generate_samples).
void launch_builtin_samples(const SyntheticSamples& samples, const std::uint64_t* stream_indices, std::int64_t count,
                              float* inputs, float* targets, std::int32_t* labels, const SampleScratch& scratch,
                              cudaStream_t stream);

}  // namespace mlptrain
