// layerbench: times one Linear layer's kernels as the trainer calls them (forward GEMM, the two
// backward GEMMs, bias+GELU forward and backward, AdamW over the layer's parameters) on a device
// (the CPU by default; --device cuda [--tf32] or loopback), and prints one JSON object. The speed
// scripts set these beside whole training steps measured in the same run.
//
// usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "train/compute_device.hpp"

namespace {

using namespace mlptrain;

// The fastest of `repeats` runs of `body`, each ended by `finish` (which waits for the device).
template <typename Body, typename Finish>
double best_ms(int repeats, Body&& body, Finish&& finish) {
  body();  // warm up
  finish();
  double best = 1e30;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const double start = now_ms();
    body();
    finish();
    best = std::min(best, now_ms() - start);
  }
  return best;
}

void run(const std::vector<std::string>& arguments) {
  std::vector<long> numbers = {256, 1024, 1024, 20};  // rows, in, out, repeats
  std::size_t position = 0;
  Config config;
  for (std::size_t index = 0; index < arguments.size(); ++index) {
    const std::string& argument = arguments[index];
    if (argument == "--device" && index + 1 < arguments.size()) {
      config.device = arguments[++index];
    } else if (argument == "--tf32") {
      config.tf32 = true;
    } else if (position < numbers.size() && !argument.empty() &&
               argument.find_first_not_of("0123456789") == std::string::npos) {
      numbers[position++] = std::stol(argument);
    } else {
      throw UsageError("usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32]");
    }
  }
  if (config.device != "cpu" && config.device != "cuda" && config.device != "loopback")
    throw UsageError("--device must be cpu, cuda or loopback");
  if (config.tf32 && config.device != "cuda") throw UsageError("--tf32 needs --device cuda");
  const long rows = numbers[0], in = numbers[1], out = numbers[2];
  const int repeats = static_cast<int>(numbers[3]);
  if (rows < 1 || in < 1 || out < 1 || repeats < 1) throw UsageError("sizes and repeats must be positive");

  MemoryLedger ledger, host_ledger;
  ComputeDevice device = open_compute_device(config, MPI_COMM_WORLD, ledger, host_ledger);
  Kernels& kernels = *device.kernels;
  Allocator& memory = *device.memory;
  const auto floats = [&](long count, float value) {
    Buffer buffer = memory.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(count));
    kernels.fill(buffer.floats(), static_cast<std::size_t>(count), value);
    return buffer;
  };
  Buffer x = floats(rows * in, 0.5f), w = floats(out * in, 0.01f), pre = floats(rows * out, 0.1f),
         act = floats(rows * out, 0), grad = floats(rows * out, 0.2f), grad_pre = floats(rows * out, 0),
         grad_x = floats(rows * in, 0), grad_w = floats(out * in, 0), bias = floats(out, 0.1f),
         bias_grad = floats(out, 0), m = floats(out * in, 0), v = floats(out * in, 0);
  // Reading one float back waits for the device's queued work (a plain copy on the host).
  const auto finish = [&] {
    float probe = 0;
    memory.copy_to_host(&probe, act.floats(), sizeof(float));
  };

  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  const auto time = [&](auto&& body) { return best_ms(repeats, body, finish); };
  const double forward = time([&] {
    kernels.gemm(Transpose::no, Transpose::yes, rows, out, in, 1, x.floats(), in, w.floats(), in, 0,
                 pre.floats(), out);
  });
  const double weight_grad = time([&] {
    kernels.gemm(Transpose::yes, Transpose::no, out, in, rows, 1, grad.floats(), out, x.floats(), in,
                 0, grad_w.floats(), in);
  });
  const double input_grad = time([&] {
    kernels.gemm(Transpose::no, Transpose::no, rows, in, out, 1, grad.floats(), out, w.floats(), in,
                 0, grad_x.floats(), in);
  });
  const double gelu_forward =
      time([&] { kernels.bias_gelu_forward(pre.floats(), bias.floats(), act.floats(), rows, out); });
  const double gelu_backward = time([&] {
    kernels.gelu_backward(grad.floats(), pre.floats(), grad_pre.floats(), bias_grad.floats(), false,
                          rows, out);
  });
  const auto parameters = static_cast<std::size_t>(out * in);
  const double adamw = time([&] {
    kernels.adamw(w.floats(), grad_w.floats(), m.floats(), v.floats(), parameters, AdamWStep{});
  });
  const double gemm_ms = forward + weight_grad + input_grad;
  const nlohmann::json result = {
      {"device", config.device}, {"tf32", config.tf32},
      {"rows", rows}, {"in", in}, {"out", out},
      {"forward_gemm_ms", forward}, {"weight_grad_gemm_ms", weight_grad},
      {"input_grad_gemm_ms", input_grad}, {"gemm_gflops", 3 * flops / gemm_ms / 1e6},
      {"bias_gelu_forward_ms", gelu_forward}, {"gelu_backward_ms", gelu_backward},
      {"adamw_ms", adamw}, {"adamw_gbytes_per_s", 28.0 * static_cast<double>(parameters) / adamw / 1e6}};
  std::puts(result.dump().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  return run_mpi_program(argc, argv, "layerbench", [&](MpiCommunicator& world) {
    agree_or_throw(world, [&] { run(arguments); });
  });
}
