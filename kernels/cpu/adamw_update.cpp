// AdamW on the CPU (see adamw_update.hpp).
#include "kernels/cpu/adamw_update.hpp"

#include <cmath>
#include <numeric>
#include <vector>

#include "core/elements.hpp"
#include "kernels/cpu/element_loops.hpp"

namespace mlptrain {

namespace {

using cpu_loops::convert_elements;
using cpu_loops::lane_sum;

constexpr std::size_t update_chunk = 1 << 16;  // a thread's unit of work: whole blocks of lane_sum

// One AdamW step's scalars, in float.
struct AdamWScalars {
  float step_size, inverse_correction2_sqrt, decay, beta1, beta2, eps, grad_scale;
};

// AdamW over `count` elements, returning the sum of squares of the gradients it read; a function
// of its own over restrict pointers (a chunk on one thread: reached through OpenMP's shared
// context instead, the loop does not vectorize and runs 5x slower). The compute copy (when
// kept) is rounded block by block, from masters still in cache.
template <typename G>
[[gnu::noinline]] double adamw_chunk(float* __restrict p, const typename G::Storage* __restrict g, float* __restrict m,
                                     float* __restrict v, std::size_t count, const AdamWScalars scalars,
                                     void* compute_copy, DataType compute_type) {
  const float beta1 = scalars.beta1, beta2 = scalars.beta2, one_minus_beta1 = 1.0f - beta1,
              one_minus_beta2 = 1.0f - beta2, grad_scale = scalars.grad_scale;
  const auto update = [&](std::size_t i) {
    const float gradient = grad_scale == 1.0f ? G::load(g[i]) : G::load(g[i]) * grad_scale;
    const float first = m[i] * beta1 + one_minus_beta1 * gradient;
    const float second = v[i] * beta2 + one_minus_beta2 * gradient * gradient;
    m[i] = first;
    v[i] = second;
    const float denominator = std::sqrt(second) * scalars.inverse_correction2_sqrt + scalars.eps;
    p[i] = p[i] * scalars.decay - scalars.step_size * (first / denominator);
    return static_cast<double>(gradient) * gradient;
  };
  if (compute_copy == nullptr) return lane_sum(count, update);
  return lane_sum(count, update, [&](std::size_t begin, std::size_t end) {
    convert_elements(p + begin, DataType::float32, advance(compute_copy, begin, compute_type), compute_type,
                     end - begin);
  });
}

}  // namespace

double adamw_update(float* master, const void* grads, DataType grads_type, float* exp_avg, float* exp_avg_sq,
                    std::size_t count, const AdamWStep& step, void* compute_copy, DataType compute_type) {
  // The scalars are formed as torch.optim.AdamW forms them: in double, then used as float;
  // sqrt(v) is divided by sqrt(1 - beta2^t) as a CUDA tensor / float divides in PyTorch (its
  // AdamW with foreach=False), times the reciprocal in float (one division an element fewer:
  // the CPU update is bound by its divider from cache, 20 % faster there, 8 % from memory).
  const double correction1 = 1.0 - std::pow(step.beta1, static_cast<double>(step.step));
  const double correction2 = 1.0 - std::pow(step.beta2, static_cast<double>(step.step));
  const AdamWScalars scalars{.step_size = static_cast<float>(step.learning_rate / correction1),
                             .inverse_correction2_sqrt = 1.0f / static_cast<float>(std::sqrt(correction2)),
                             .decay = static_cast<float>(1.0 - step.learning_rate * step.weight_decay),
                             .beta1 = static_cast<float>(step.beta1),
                             .beta2 = static_cast<float>(step.beta2),
                             .eps = static_cast<float>(step.eps),
                             .grad_scale = step.grad_scale};
  return with_element(grads_type, [&](auto grad_element) {
    using G = decltype(grad_element);
    // Spread over the rank's GEMM threads (the update is bound by memory bandwidth, which one
    // core of this machine does not fill) in fixed chunks, each chunk's sum of squares its
    // own and the sums added in chunk order: the same norm on any number of threads.
    const std::size_t chunks = (count + update_chunk - 1) / update_chunk;
    std::vector<double> chunk_sums(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t first = chunk * update_chunk;
      chunk_sums[chunk] = adamw_chunk<G>(master + first, elements<G>(grads) + first, exp_avg + first,
                                         exp_avg_sq + first, std::min(update_chunk, count - first), scalars,
                                         compute_copy == nullptr ? nullptr : advance(compute_copy, first, compute_type),
                                         compute_type);
    }
    return std::accumulate(chunk_sums.begin(), chunk_sums.end(), 0.0);
  });
}

}  // namespace mlptrain
