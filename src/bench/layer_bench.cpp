// layerbench: times one Linear layer's kernels as the trainer calls them (forward GEMM, the two
// backward GEMMs, bias+GELU forward and backward, AdamW over the layer's parameters) on a device
// (the CPU by default; --device cuda [--tf32] or loopback), and prints one JSON object per GEMM
// input type (--dtype fp32,bf16: fp32 accumulation and output either way). On the CPU each object
// also holds the same GEMMs timed through oneDNN's own interface, the library's rate beside ours,
// and with --sequence N the fp32 one the library's time per GEMM when N layers' GEMMs run in a
// training step's order over buffers of their own. The speed scripts set these beside whole
// training steps measured in the same run.
//
// usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32] [--dtype LIST]
//                   [--sequence LAYERS]
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/library_gemm.hpp"
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

// One GEMM shape of a layer's step (forward, weight gradient or input gradient).
struct GemmShape {
  const char* name;
  Transpose transpose_a, transpose_b;
  long m, n, k, lda, ldb, ldc;
};

DataType gemm_input(const std::string& name) {
  if (name == "fp32") return DataType::float32;
  if (name == "bf16") return DataType::bfloat16;
  if (name == "fp16") return DataType::float16;
  throw UsageError("--dtype: unknown type '" + name + "' (choose fp32, bf16 or fp16)");
}

void run(const std::vector<std::string>& arguments) {
  std::vector<long> numbers = {256, 1024, 1024, 20};  // rows, in, out, repeats
  std::size_t position = 0;
  Config config;
  std::vector<DataType> inputs;
  long sequence = 0;
  for (std::size_t index = 0; index < arguments.size(); ++index) {
    const std::string& argument = arguments[index];
    if (argument == "--device" && index + 1 < arguments.size()) {
      const auto device = parse_choice<Device>(arguments[++index]);
      if (!device) throw UsageError("--device must be " + choice_list<Device>());
      config.device = *device;
    } else if (argument == "--tf32") {
      config.tf32 = true;
    } else if (argument == "--dtype" && index + 1 < arguments.size()) {
      std::string list = arguments[++index] + ",";
      for (std::size_t comma; (comma = list.find(',')) != std::string::npos; list.erase(0, comma + 1))
        inputs.push_back(gemm_input(list.substr(0, comma)));
    } else if (argument == "--sequence" && index + 1 < arguments.size()) {
      sequence = std::stol(arguments[++index]);
    } else if (position < numbers.size() && !argument.empty() &&
               argument.find_first_not_of("0123456789") == std::string::npos) {
      numbers[position++] = std::stol(argument);
    } else {
      throw UsageError("usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32] "
                       "[--dtype fp32,bf16,fp16] [--sequence LAYERS]");
    }
  }
  if (inputs.empty()) inputs.push_back(DataType::float32);
  if (config.tf32 && config.device != Device::cuda) throw UsageError("--tf32 needs --device cuda");
  const long rows = numbers[0], in = numbers[1], out = numbers[2];
  const int repeats = static_cast<int>(numbers[3]);
  if (rows < 1 || in < 1 || out < 1 || repeats < 1 || sequence < 0)
    throw UsageError("sizes and repeats must be positive");
  if (sequence > 0 && in != out) throw UsageError("--sequence chains layers: it needs IN equal to OUT");

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
  const auto time = [&](auto&& body) { return best_ms(repeats, body, finish); };

  // The elementwise kernels and AdamW, on fp32 as the trainer runs them.
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

  // The three GEMMs of the layer's step: pre = x W^T, dW = grad^T x, dx = grad W.
  const GemmShape shapes[] = {
      {"forward", Transpose::no, Transpose::yes, rows, out, in, in, in, out},
      {"weight_grad", Transpose::yes, Transpose::no, out, in, rows, out, in, in},
      {"input_grad", Transpose::no, Transpose::no, rows, in, out, out, in, in}};
  const void* operands[][2] = {{x.floats(), w.floats()}, {grad.floats(), x.floats()}, {grad.floats(), w.floats()}};
  float* results[] = {pre.floats(), grad_w.floats(), grad_x.floats()};
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  // The library's time per GEMM in a step's order: every layer forward, then each layer's input
  // and weight gradients from the last back, each layer over buffers of its own. Its operands no
  // longer repeat, as they do above, so this is the rate a training step's GEMMs can have.
  std::optional<double> sequence_gemm_ms;
  if (sequence > 0 && config.device == Device::cpu) {
    std::vector<Buffer> held;
    const auto layer_floats = [&](long count, float value) { return held.emplace_back(floats(count, value)).floats(); };
    std::vector<Gemm> forward, backward;
    for (long layer = 0; layer < sequence; ++layer) {
      float *x_l = layer_floats(rows * in, 0.5f), *w_l = layer_floats(out * in, 0.01f);
      float *grad_l = layer_floats(rows * out, 0.2f), *pre_l = layer_floats(rows * out, 0);
      float *grad_x_l = layer_floats(rows * in, 0), *grad_w_l = layer_floats(out * in, 0);
      forward.push_back({.transpose_b = Transpose::yes, .m = rows, .n = out, .k = in, .a = x_l, .lda = in, .b = w_l,
                         .ldb = in, .c = pre_l, .ldc = out});
      backward.insert(backward.begin(),
                      {Gemm{.m = rows, .n = in, .k = out, .a = grad_l, .lda = out, .b = w_l, .ldb = in, .c = grad_x_l, .ldc = in},
                       Gemm{.transpose_a = Transpose::yes, .m = out, .n = in, .k = rows, .a = grad_l, .lda = out, .b = x_l,
                            .ldb = in, .c = grad_w_l, .ldc = in}});
    }
    forward.insert(forward.end(), backward.begin(), backward.end());
    if (const auto library = time_library_gemms(forward, repeats))
      sequence_gemm_ms = library->best_ms / static_cast<double>(forward.size());
  }
  for (DataType input : inputs) {
    // Half inputs are the fp32 operands rounded (their values do not change the time).
    Buffer half_a[3], half_b[3];
    nlohmann::json result = {{"device", choice_name(config.device)}, {"tf32", config.tf32}, {"dtype", data_type_name(input)},
                             {"rows", rows}, {"in", in}, {"out", out}, {"kernels", kernels.description()}};
    double gemm_ms = 0, library_ms = 0;
    for (std::size_t index = 0; index < 3; ++index) {
      const GemmShape& shape = shapes[index];
      Gemm gemm{.transpose_a = shape.transpose_a, .transpose_b = shape.transpose_b, .m = shape.m, .n = shape.n,
                .k = shape.k, .a = operands[index][0], .lda = shape.lda, .b = operands[index][1],
                .ldb = shape.ldb, .c = results[index], .ldc = shape.ldc, .input = input};
      if (input != DataType::float32) {
        const auto a_count = static_cast<std::size_t>(shape.m * shape.k), b_count = static_cast<std::size_t>(shape.k * shape.n);
        half_a[index] = memory.allocate(MemoryState::workspace, a_count * size_of(input));
        half_b[index] = memory.allocate(MemoryState::workspace, b_count * size_of(input));
        kernels.convert(gemm.a, DataType::float32, half_a[index].as<void>(), input, a_count);
        kernels.convert(gemm.b, DataType::float32, half_b[index].as<void>(), input, b_count);
        gemm.a = half_a[index].as<void>();
        gemm.b = half_b[index].as<void>();
      }
      const double ms = time([&] { kernels.gemm(gemm); });
      result[std::string(shape.name) + "_gemm_ms"] = ms;
      gemm_ms += ms;
      if (config.device != Device::cpu) continue;
      if (const auto library = time_library_gemms({gemm}, repeats)) {
        result[std::string("library_") + shape.name + "_gemm_ms"] = library->best_ms;
        result["library_implementation"] = library->implementation;
        library_ms += library->best_ms;
      } else {
        result["library_implementation"] = nullptr;  // none for these inputs: ours widen them
      }
    }
    result["gemm_gflops"] = 3 * flops / gemm_ms / 1e6;
    if (library_ms > 0 && !result["library_implementation"].is_null()) {
      result["library_gemm_gflops"] = 3 * flops / library_ms / 1e6;
      result["gemm_over_library"] = gemm_ms / library_ms;
    }
    if (sequence_gemm_ms && input == DataType::float32)
      result.update({{"sequence_layers", sequence}, {"library_sequence_gemm_ms", *sequence_gemm_ms}});
    result.update({{"bias_gelu_forward_ms", gelu_forward}, {"gelu_backward_ms", gelu_backward},
                   {"adamw_ms", adamw}, {"adamw_gbytes_per_s", 28.0 * static_cast<double>(parameters) / adamw / 1e6}});
    std::puts(result.dump().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  return run_mpi_program(argc, argv, "layerbench", [&](MpiCommunicator& world) {
    agree_or_throw(world, [&] { run(arguments); });
  });
}
