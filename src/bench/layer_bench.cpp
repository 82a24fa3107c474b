// layerbench: times one Linear layer's kernels as the trainer calls them (forward GEMM, the two
// backward GEMMs, bias+GELU forward and backward, AdamW over the layer's parameters) on the CPU
// backend, and prints one JSON object. The scaling scripts set these beside whole training steps.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/timer.hpp"
#include "kernels/kernels.hpp"

namespace {

template <typename Body>
double best_ms(int repeats, Body&& body) {
  body();  // warm up
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const double start = mlptrain::now_ms();
    body();
    best = std::min(best, mlptrain::now_ms() - start);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlptrain;
  const long rows = argc > 1 ? std::atol(argv[1]) : 256;
  const long in = argc > 2 ? std::atol(argv[2]) : 1024;
  const long out = argc > 3 ? std::atol(argv[3]) : 1024;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 20;
  auto kernels = make_cpu_kernels();
  std::vector<float> x(rows * in, 0.5f), w(out * in, 0.01f), pre(rows * out, 0.1f),
      act(rows * out), grad(rows * out, 0.2f), grad_pre(rows * out), grad_x(rows * in),
      grad_w(out * in), bias(out, 0.1f), bias_grad(out), m(out * in), v(out * in);
  const double flops = 2.0 * rows * in * out;
  const double forward = best_ms(repeats, [&] {
    kernels->gemm(Transpose::no, Transpose::yes, rows, out, in, 1, x.data(), in, w.data(), in, 0,
                  pre.data(), out);
  });
  const double weight_grad = best_ms(repeats, [&] {
    kernels->gemm(Transpose::yes, Transpose::no, out, in, rows, 1, grad.data(), out, x.data(), in,
                  0, grad_w.data(), in);
  });
  const double input_grad = best_ms(repeats, [&] {
    kernels->gemm(Transpose::no, Transpose::no, rows, in, out, 1, grad.data(), out, w.data(), in,
                  0, grad_x.data(), in);
  });
  const double gelu_forward = best_ms(repeats, [&] {
    kernels->bias_gelu_forward(pre.data(), bias.data(), act.data(), rows, out);
  });
  const double gelu_backward = best_ms(repeats, [&] {
    kernels->gelu_backward(grad.data(), pre.data(), grad_pre.data(), bias_grad.data(), false, rows,
                           out);
  });
  const double adamw = best_ms(repeats, [&] {
    kernels->adamw(w.data(), grad_w.data(), m.data(), v.data(), w.size(), AdamWStep{});
  });
  const double gemm_ms = forward + weight_grad + input_grad;
  const nlohmann::json result = {
      {"rows", rows}, {"in", in}, {"out", out},
      {"forward_gemm_ms", forward}, {"weight_grad_gemm_ms", weight_grad},
      {"input_grad_gemm_ms", input_grad}, {"gemm_gflops", 3 * flops / gemm_ms / 1e6},
      {"bias_gelu_forward_ms", gelu_forward}, {"gelu_backward_ms", gelu_backward},
      {"adamw_ms", adamw}, {"adamw_gbytes_per_s", 28.0 * w.size() / adamw / 1e6}};
  std::puts(result.dump().c_str());
  return 0;
}
