// Checkpoints at whatever world size mpiexec gives: tensors written as row blocks spread over the
// ranks (as a sharded layout holds them) read back whole in another layout, the checksums joined
// from the ranks' pieces equal the checksum of the whole tensor, and pieces that leave a gap are
// refused rather than written.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zlib.h>

#include <unistd.h>

#include <filesystem>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/hdf5_handle.hpp"
#include "io/checkpoint.hpp"

using namespace mlptrain;

namespace {

float value_of(const ParameterTensor& tensor, std::int64_t global_index, int part) {
  return static_cast<float>(tensor.global_index * 1000 + global_index) * (part + 1) * 0.5f;
}

class CheckpointTest : public ::testing::Test {
 protected:
  CommLedger ledger;
  MpiCommunicator world{MPI_COMM_WORLD, "world", ledger};
  MemoryLedger memory;
  HostAllocator allocator{memory};
  std::vector<LayerSpec> specs = dense_layer_specs(3, 5, 8, 3);
  std::vector<ParameterTensor> whole = dense_parameter_tensors(specs, 0, 3);
  GridShape shape{.world = world.size(), .tp = 1, .dp = world.size(), .pp = 1, .ep = 1};

  std::string directory() {
    // One directory for all ranks: rank 0's process id names it.
    std::int64_t id = getpid();
    world.broadcast(&id, 1, 0);
    return ::testing::TempDir() + "checkpoint-test-" + std::to_string(id);
  }

  // Weights split by rows over the ranks (rank r holds rows [r*out/n, (r+1)*out/n)); biases whole.
  std::vector<ParameterTensor> row_blocks(int rank) const {
    std::vector<ParameterTensor> tensors;
    std::size_t offset = 0;
    for (ParameterTensor tensor : whole) {
      if (tensor.global_shape.size() == 2) {
        const std::int64_t rows = tensor.global_shape[0], n = world.size();
        const std::int64_t first = rows * rank / n, last = rows * (rank + 1) / n;
        tensor.local_start = {first, 0};
        tensor.local_shape = {last - first, tensor.global_shape[1]};
        tensor.replicated_over_data = false;
      }
      tensor.offset = offset;
      tensor.count = static_cast<std::size_t>(tensor.local_shape[0]) *
                     (tensor.local_shape.size() == 2 ? tensor.local_shape[1] : 1);
      offset += tensor.count;
      tensors.push_back(tensor);
    }
    return tensors;
  }

  CheckpointScope scope() {
    return {.world = world, .mpi_comm = MPI_COMM_WORLD, .shape = shape,
            .place = coordinates_of(shape, world.rank()), .global_tensors = whole, .layer_count = 3};
  }
};

}  // namespace

TEST_F(CheckpointTest, RowBlocksWrittenByAllRanksLoadWholeInAnotherLayout) {
  ParameterStore written(row_blocks(world.rank()), allocator);
  std::vector<float> exp_avg(written.size()), exp_avg_sq(written.size());
  for (const ParameterTensor& tensor : written.tensors()) {
    float* parts[3] = {written.values(), exp_avg.data(), exp_avg_sq.data()};
    for_each_run(tensor.global_shape, tensor.local_start, tensor.local_shape,
                 [&](std::int64_t global, std::int64_t local, std::int64_t count) {
                   for (std::int64_t i = 0; i < count; ++i)
                     for (int part = 0; part < 3; ++part)
                       parts[part][tensor.offset + local + i] = value_of(tensor, global + i, part);
                 });
  }
  const std::string dir = directory();
  if (world.rank() == 0) prepare_checkpoint_directory(dir);
  world.barrier();
  const std::string path =
      save_checkpoint(dir, {written, exp_avg.data(), exp_avg_sq.data(), 7, 112},
                      {.config_ini = "layers = 3\n", .layout = "test", .seed = 1}, scope());

  ParameterStore loaded(whole, allocator);
  std::vector<float> loaded_avg(loaded.size()), loaded_avg_sq(loaded.size());
  TrainingState state{loaded, loaded_avg.data(), loaded_avg_sq.data()};
  EXPECT_EQ(load_checkpoint(dir, state, scope()), path);
  EXPECT_EQ(state.step, 7);
  EXPECT_EQ(state.data_position, 112);
  for (const ParameterTensor& tensor : loaded.tensors())
    for (std::size_t i = 0; i < tensor.count; ++i) {
      ASSERT_EQ(loaded.values()[tensor.offset + i], value_of(tensor, i, 0)) << tensor.path;
      ASSERT_EQ(loaded_avg_sq[tensor.offset + i], value_of(tensor, i, 2)) << tensor.path;
    }

  // The joined checksum is the CRC-32 of the whole tensor.
  if (world.rank() == 0) {
    Hdf5Handle file = file_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    const ParameterTensor& weight = loaded.tensor("layers/01/weight");
    Hdf5Handle dataset = dataset_handle(H5Dopen2(file.get(), "/model/layers/01/weight", H5P_DEFAULT));
    Hdf5Handle attribute = attribute_handle(H5Aopen(dataset.get(), "crc32", H5P_DEFAULT));
    std::uint32_t stored = 0;
    H5Aread(attribute.get(), H5T_NATIVE_UINT32, &stored);
    const auto expected = crc32(0L, reinterpret_cast<const Bytef*>(loaded.values() + weight.offset),
                                static_cast<uInt>(weight.count * sizeof(float)));
    EXPECT_EQ(stored, expected);
    std::filesystem::remove_all(dir);
  }
  world.barrier();
}

TEST_F(CheckpointTest, PiecesThatLeaveAGapAreRefused) {
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks to leave another rank's rows out";
  std::vector<ParameterTensor> pieces = row_blocks(world.rank());
  if (world.rank() == 1) pieces[0].local_shape[0] = 0, pieces[0].count = 0;  // rank 1 drops its rows
  ParameterStore written(pieces, allocator);
  std::vector<float> moments(written.size() + 1);
  const std::string dir = directory();
  EXPECT_THROW(save_checkpoint(dir, {written, moments.data(), moments.data(), 1, 1}, {}, scope()),
               RuntimeFailure);
}
