// layerbench: times one Linear layer's kernels as the trainer calls them (forward GEMM, the two
// backward GEMMs, bias+GELU forward and backward, a gather of its rows as MoE layers move them,
// AdamW over the layer's parameters, or over --optimizer-parameters N where a rank updates more
// than the caches hold, and there also each layer-sized piece updated as soon as its gradient is
// written against all after every gradient) on a device
// (the CPU by default; --device cuda [--tf32] or loopback), and prints one JSON object per GEMM
// param type (--dtype fp32,bf16,fp16: activations and weights of that type, fp32 accumulation,
// fp32 weight gradients and optimizer state). On the CPU each object also holds the same GEMMs
// timed through oneDNN's own interface, the library's rate beside ours, and with --sequence N the
// library's time per GEMM when N layers' GEMMs run in a training step's order over buffers of
// their own. Each object also holds the time to read ROWS shuffled samples of IN inputs as the
// trainer reads them on one core: from the built-in datasets, and from a uint8 file held in
// memory. The speed scripts set these beside whole training steps measured in the same run.
//
// usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32] [--dtype LIST]
//                   [--sequence LAYERS] [--optimizer-parameters N]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/library_gemm.hpp"
#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "comm/rank_texts.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "core/timer.hpp"
#include "data/dataset.hpp"
#include "device/compute_device.hpp"

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

// Writes `rows` samples of `in` uint8 inputs (scaled by 1/255 when read) and their labels to
// `path`, in the hdf5 dataset's layout.
void write_image_file(const std::string& path, long rows, long in) {
  Hdf5Handle file = file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!file.valid()) throw RuntimeFailure("layerbench: cannot write " + path);
  const auto write = [&](const char* name, hid_t type, std::vector<hsize_t> shape, const void* data) {
    Hdf5Handle space = dataspace_handle(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
    Hdf5Handle set = dataset_handle(H5Dcreate2(file.get(), name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Dwrite(set.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    return set;
  };
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(rows * in));
  for (std::size_t index = 0; index < pixels.size(); ++index) pixels[index] = static_cast<std::uint8_t>(index * 7);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t row = 0; row < labels.size(); ++row) labels[row] = static_cast<std::int32_t>(row % 10);
  Hdf5Handle x = write("/x", H5T_NATIVE_UINT8, {static_cast<hsize_t>(rows), static_cast<hsize_t>(in)}, pixels.data());
  Hdf5Handle scalar = dataspace_handle(H5Screate(H5S_SCALAR));
  Hdf5Handle scale = attribute_handle(H5Acreate2(x.get(), "scale", H5T_NATIVE_DOUBLE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT));
  const double one_255th = 1.0 / 255;
  H5Awrite(scale.get(), H5T_NATIVE_DOUBLE, &one_255th);
  write("/y", H5T_NATIVE_INT32, {static_cast<hsize_t>(rows)}, labels.data());
}

// Milliseconds to read `rows` samples (every other one, in reverse: a shuffled batch's rows are
// not neighbours) of `in` inputs and their targets or labels, as the trainer reads them.
nlohmann::json sample_reads(long rows, long in, long out, int repeats) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("layerbench-" + std::to_string(getpid()) + ".h5")).string();
  write_image_file(path, 2 * rows, in);
  std::vector<std::int64_t> indices(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::int64_t>(2 * (indices.size() - 1 - i));
  std::vector<float> inputs(static_cast<std::size_t>(rows * in)), targets(static_cast<std::size_t>(rows * out));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  nlohmann::json result;
  for (auto [key, options] :
       {std::pair{"teacher_read_ms", DataOptions{.kind = DatasetKind::teacher, .input_dim = in, .output_dim = out}},
        std::pair{"mixture_read_ms", DataOptions{.kind = DatasetKind::mixture, .input_dim = in, .output_dim = out}},
        std::pair{"held_file_read_ms", DataOptions{.kind = DatasetKind::hdf5, .path = path, .memory_cap_bytes = 1ll << 40}}}) {
    std::unique_ptr<Dataset> dataset = open_dataset(options);
    const bool classes = dataset->info().kind == TargetKind::classification;
    result[key] = best_ms(repeats, [&] {
      dataset->read(Split::train, indices, inputs.data(), classes ? nullptr : targets.data(), classes ? labels.data() : nullptr);
    }, [] {});
  }
  std::filesystem::remove(path);
  return result;
}

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
  long sequence = 0, optimizer_parameters = 0;
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
    } else if (argument == "--optimizer-parameters" && index + 1 < arguments.size()) {
      optimizer_parameters = std::stol(arguments[++index]);
    } else if (position < numbers.size() && !argument.empty() &&
               argument.find_first_not_of("0123456789") == std::string::npos) {
      numbers[position++] = std::stol(argument);
    } else {
      throw UsageError("usage: layerbench [ROWS IN OUT [REPEATS]] [--device cpu|cuda|loopback] [--tf32] "
                       "[--dtype fp32,bf16,fp16] [--sequence LAYERS] [--optimizer-parameters N]");
    }
  }
  if (inputs.empty()) inputs.push_back(DataType::float32);
  if (config.tf32 && config.device != Device::cuda) throw UsageError("--tf32 needs --device cuda");
  const long rows = numbers[0], in = numbers[1], out = numbers[2];
  const int repeats = static_cast<int>(numbers[3]);
  if (rows < 1 || in < 1 || out < 1 || repeats < 1 || sequence < 0 || optimizer_parameters < 0)
    throw UsageError("sizes and repeats must be positive");
  if (sequence > 0 && in != out) throw UsageError("--sequence chains layers: it needs IN equal to OUT");

  MemoryLedger ledger, host_ledger;
  ComputeDevice device = open_compute_device(config, MPI_COMM_WORLD, ledger, host_ledger);
  Kernels& kernels = *device.kernels;
  Allocator& memory = *device.memory;
  // Buffers of `count` elements of `type` filled with `value` (rounded).
  const auto filled = [&](long count, float value, DataType type) {
    Buffer buffer = memory.allocate_elements(MemoryState::workspace, static_cast<std::size_t>(count), type);
    kernels.fill(buffer.as<void>(), type, static_cast<std::size_t>(count), value);
    return buffer;
  };
  // Reading one byte back waits for the device's queued work (a plain copy on the host).
  Buffer probe_buffer = filled(1, 0, DataType::float32);
  const auto finish = [&] {
    float probe = 0;
    memory.copy_to_host(&probe, probe_buffer.floats(), sizeof(float));
  };
  const auto time = [&](auto&& body) { return best_ms(repeats, body, finish); };
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  const auto parameters = static_cast<std::size_t>(optimizer_parameters > 0 ? optimizer_parameters : out * in);
  const nlohmann::json reads = sample_reads(rows, in, out, repeats);

  for (DataType type : inputs) {
    // Activations, weights and their GEMM outputs of the param type `type`; gradients of the
    // parameters and the optimizer state in fp32, as the trainer holds them by default.
    const DataType fp32 = DataType::float32;
    Buffer x = filled(rows * in, 0.5f, type), w = filled(out * in, 0.01f, type), pre = filled(rows * out, 0.1f, type),
           act = filled(rows * out, 0, type), grad = filled(rows * out, 0.2f, type),
           grad_pre = filled(rows * out, 0, type), grad_x = filled(rows * in, 0, type),
           grad_w = filled(out * in, 0, fp32), bias = filled(out, 0.1f, type), bias_grad = filled(out, 0, fp32);
    // The optimizer's own buffers, of the parameters it updates.
    const auto updated = static_cast<long>(parameters);
    Buffer values = filled(updated, 0.01f, type), gradients = filled(updated, 0.001f, fp32),
           master = filled(updated, 0.01f, fp32), m = filled(updated, 0, fp32), v = filled(updated, 0, fp32);
    nlohmann::json result = {{"device", choice_name(config.device)}, {"tf32", config.tf32}, {"dtype", data_type_name(type)},
                             {"rows", rows}, {"in", in}, {"out", out}, {"adamw_parameters", updated},
                             {"kernels", kernels.description()}};
    result.update(reads);
    // The elementwise kernels and AdamW as the trainer runs them at this param type (a 16-bit
    // one updates fp32 masters and writes their rounded copy).
    result["gelu_forward_ms"] = time([&] { kernels.gelu_forward(pre.as<void>(), act.as<void>(), rows, out, type); });
    result["gelu_backward_ms"] = time([&] {
      kernels.gelu_backward(grad.as<void>(), pre.as<void>(), grad_pre.as<void>(), type, bias_grad.as<void>(), fp32,
                            false, rows, out);
    });
    // Rows gathered by an index, as an MoE layer dispatches and combines them (every row moves:
    // the index reverses their order).
    {
      std::vector<std::int32_t> reversed(static_cast<std::size_t>(rows));
      for (long row = 0; row < rows; ++row) reversed[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(rows - 1 - row);
      Buffer order = memory.allocate(MemoryState::workspace, reversed.size() * sizeof(std::int32_t));
      memory.copy_to_device(order.as<void>(), reversed.data(), order.bytes());
      result["gather_rows_ms"] = time([&] {
        kernels.gather_rows(act.as<void>(), order.as<std::int32_t>(), nullptr, grad_pre.as<void>(), rows, out, type);
      });
    }
    const bool half = type != fp32;
    const double adamw = time([&] {
      kernels.adamw(half ? master.floats() : values.floats(), gradients.as<void>(), fp32, m.floats(), v.floats(),
                    parameters, AdamWStep{}, half ? values.as<void>() : nullptr, type);
    });
    // Bytes AdamW moves per parameter: weights, gradients and two moments read, weights and
    // moments written, and a 16-bit run's compute copy written.
    const double adamw_bytes = 28.0 + (half ? 2.0 : 0.0);
    result.update({{"adamw_ms", adamw}, {"adamw_gbytes_per_s", adamw_bytes * static_cast<double>(parameters) / adamw / 1e6}});
    // Whether updating each layer as soon as its gradient is written pays (the gradient still in
    // cache) against updating after every gradient: the same writes and updates in both orders,
    // over --optimizer-parameters N in pieces of this layer's size.
    const auto layer_parameters = static_cast<std::size_t>(out * in + out);
    if (const std::size_t pieces = parameters / layer_parameters; pieces >= 2) {
      const auto write_gradient = [&](std::size_t piece) {
        kernels.fill(gradients.floats() + piece * layer_parameters, fp32, layer_parameters, 0.001f);
      };
      const auto update = [&](std::size_t first_piece, std::size_t count) {
        const std::size_t first = first_piece * layer_parameters;
        kernels.adamw((half ? master.floats() : values.floats()) + first, gradients.floats() + first, fp32,
                      m.floats() + first, v.floats() + first, count * layer_parameters, AdamWStep{},
                      half ? static_cast<char*>(values.as<void>()) + first * size_of(type) : nullptr, type);
      };
      result["adamw_after_all_gradients_ms"] = time([&] {
        for (std::size_t piece = pieces; piece-- > 0;) write_gradient(piece);
        update(0, pieces);
      });
      result["adamw_after_each_gradient_ms"] = time([&] {
        for (std::size_t piece = pieces; piece-- > 0;) {
          write_gradient(piece);
          update(piece, 1);
        }
      });
    }

    // The three GEMMs of the layer's step: pre = x W^T, dW = grad^T x, dx = grad W.
    const GemmShape shapes[] = {
        {"forward", Transpose::no, Transpose::yes, rows, out, in, in, in, out},
        {"weight_grad", Transpose::yes, Transpose::no, out, in, rows, out, in, in},
        {"input_grad", Transpose::no, Transpose::no, rows, in, out, out, in, in}};
    const Buffer* operands[][2] = {{&x, &w}, {&grad, &x}, {&grad, &w}};
    const Buffer* results[] = {&pre, &grad_w, &grad_x};
    const DataType output_types[] = {type, fp32, type};
    double gemm_ms = 0, library_ms = 0;
    for (std::size_t index = 0; index < 3; ++index) {
      const GemmShape& shape = shapes[index];
      const Gemm gemm{.transpose_a = shape.transpose_a, .transpose_b = shape.transpose_b, .m = shape.m, .n = shape.n,
                      .k = shape.k, .a = operands[index][0]->as<void>(), .lda = shape.lda,
                      .b = operands[index][1]->as<void>(), .ldb = shape.ldb, .c = results[index]->as<void>(),
                      .ldc = shape.ldc, .input = type, .output = output_types[index]};
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
    // The library's time per GEMM in a step's order: every layer forward, then each layer's input
    // and weight gradients from the last back, each layer over buffers of its own. Its operands no
    // longer repeat, as they do above, so this is the rate a training step's GEMMs can have.
    if (sequence > 0 && config.device == Device::cpu) {
      std::vector<Buffer> held;
      const auto layer_buffer = [&](long count, float value, DataType element) {
        return held.emplace_back(filled(count, value, element)).as<void>();
      };
      std::vector<Gemm> forward, backward;
      for (long layer = 0; layer < sequence; ++layer) {
        void *x_l = layer_buffer(rows * in, 0.5f, type), *w_l = layer_buffer(out * in, 0.01f, type);
        void *grad_l = layer_buffer(rows * out, 0.2f, type), *pre_l = layer_buffer(rows * out, 0, type);
        void *grad_x_l = layer_buffer(rows * in, 0, type), *grad_w_l = layer_buffer(out * in, 0, fp32);
        forward.push_back({.transpose_b = Transpose::yes, .m = rows, .n = out, .k = in, .a = x_l, .lda = in, .b = w_l,
                           .ldb = in, .c = pre_l, .ldc = out, .input = type, .output = type});
        backward.insert(backward.begin(),
                        {Gemm{.m = rows, .n = in, .k = out, .a = grad_l, .lda = out, .b = w_l, .ldb = in, .c = grad_x_l,
                              .ldc = in, .input = type, .output = type},
                         Gemm{.transpose_a = Transpose::yes, .m = out, .n = in, .k = rows, .a = grad_l, .lda = out,
                              .b = x_l, .ldb = in, .c = grad_w_l, .ldc = in, .input = type, .output = fp32}});
      }
      forward.insert(forward.end(), backward.begin(), backward.end());
      if (const auto library = time_library_gemms(forward, repeats))
        result.update({{"sequence_layers", sequence},
                       {"library_sequence_gemm_ms", library->best_ms / static_cast<double>(forward.size())}});
    }
    // One process prints every rank's line: lines mpiexec merges from several can interleave.
    texts_to_rank_zero(MPI_COMM_WORLD, result.dump(), [](const std::string& line) { std::puts(line.c_str()); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  return run_mpi_program(argc, argv, "layerbench", [&](MpiCommunicator& world) {
    agree_or_throw(world, [&] { run(arguments); });
  });
}
