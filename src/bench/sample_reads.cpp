// The trainer's sample reads timed (see sample_reads.hpp).
#include "bench/sample_reads.hpp"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_timing.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "data/dataset.hpp"

namespace mlptrain {

namespace {

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

}  // namespace

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

}  // namespace mlptrain
