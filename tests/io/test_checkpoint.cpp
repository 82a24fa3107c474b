// Checkpoints at whatever world size mpiexec gives: state spread over the ranks as flat shards
// (as ZeRO holds it), as column blocks (as a tensor-parallel layout would) or whole on every rank
// (as data parallelism holds it, each rank writing a slice), written, read back whole in another
// layout; the checksums joined from the ranks' pieces equal the checksum of the whole tensor;
// pieces that leave a gap are refused rather than written, a state that is not finite is not
// published.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/half_float.hpp"
#include "core/hdf5_handle.hpp"
#include "io/checkpoint.hpp"

using namespace mlptrain;

namespace {

float value_of(const ParameterTensor& tensor, std::int64_t global_index, int part) {
  return static_cast<float>(tensor.global_index * 1000 + global_index) * (part + 1) * 0.5f;
}

// A layout's runs (fp32: the values are the masters), with the memory behind them.
struct Layout {
  StatePlacement placement;
  std::vector<std::vector<float>> memory;  // values, exp_avg, exp_avg_sq per run

  void add(const ParameterTensor& tensor, std::int64_t offset, std::int64_t count, RangeCopies copies = {}) {
    memory.emplace_back(3 * count);
    float* base = memory.back().data();
    placement.updated.push_back({.tensor = &tensor, .offset = offset, .count = count, .values = base,
                                 .master = base, .exp_avg = base + count, .exp_avg_sq = base + 2 * count,
                                 .copies = copies});
    placement.held = placement.updated;
  }
  void fill() {
    for (StateRange& run : placement.updated)
      for (std::int64_t i = 0; i < run.count; ++i) {
        run.master[i] = value_of(*run.tensor, run.offset + i, 0);
        run.exp_avg[i] = value_of(*run.tensor, run.offset + i, 1);
        run.exp_avg_sq[i] = value_of(*run.tensor, run.offset + i, 2);
      }
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  CommLedger ledger;
  MpiCommunicator world{MPI_COMM_WORLD, "world", ledger};
  MemoryLedger memory;
  HostAllocator allocator{memory};
  std::vector<ParameterTensor> whole = model_parameter_tensors(model_layer_specs(3, 5, 8, 3), 0, 3);

  std::string directory() {
    // One directory for all ranks: rank 0's process id names it.
    std::int64_t id = getpid();
    world.broadcast(&id, 1, 0);
    return ::testing::TempDir() + "checkpoint-test-" + std::to_string(id);
  }

  CheckpointScope scope() {
    return {.world = world, .mpi_comm = MPI_COMM_WORLD, .allocator = allocator,
            .global_tensors = whole, .layer_count = 3};
  }

  // The model's elements in tensor order split into equal flat ranges, one per rank.
  Layout flat_shards() {
    Layout layout;
    std::int64_t total = 0;
    for (const ParameterTensor& tensor : whole) total += static_cast<std::int64_t>(tensor.count);
    const std::int64_t begin = total * world.rank() / world.size();
    const std::int64_t end = total * (world.rank() + 1) / world.size();
    std::int64_t at = 0;
    for (const ParameterTensor& tensor : whole) {
      const auto count = static_cast<std::int64_t>(tensor.count);
      const std::int64_t first = std::max(begin, at), last = std::min(end, at + count);
      if (first < last) layout.add(tensor, first - at, last - first);
      at += count;
    }
    return layout;
  }

  // Each weight split by columns (a run per row); biases whole on one rank.
  Layout column_blocks() {
    Layout layout;
    for (const ParameterTensor& tensor : whole) {
      if (tensor.global_shape.size() == 1) {
        if (tensor.global_index % world.size() == world.rank())
          layout.add(tensor, 0, static_cast<std::int64_t>(tensor.count));
        continue;
      }
      const std::int64_t rows = tensor.global_shape[0], columns = tensor.global_shape[1];
      const std::int64_t first = columns * world.rank() / world.size();
      const std::int64_t last = columns * (world.rank() + 1) / world.size();
      if (first < last)
        for (std::int64_t row = 0; row < rows; ++row) layout.add(tensor, row * columns + first, last - first);
    }
    return layout;
  }

  // Every tensor whole on every rank, as plain data parallelism holds it: each a copy.
  Layout replicated() {
    Layout layout;
    for (const ParameterTensor& tensor : whole)
      layout.add(tensor, 0, static_cast<std::int64_t>(tensor.count), {world.rank(), world.size()});
    return layout;
  }

  void round_trip(Layout written) {
    written.fill();
    const std::string dir = directory();
    if (world.rank() == 0) prepare_checkpoint_directory(dir);
    world.barrier();
    const std::string path = save_checkpoint(
        dir, {.placement = written.placement, .step = 7, .optimizer_step = 6, .data_position = 112},
        {.config_ini = "layers = 3\n", .layout = "test", .seed = 1}, scope());

    // Read back whole on every rank, as one process or plain data parallelism holds it.
    ParameterStore store(whole, allocator);
    const GridShape replicated{.world = world.size(), .tp = 1, .dp = world.size(), .pp = 1, .ep = 1};
    StatePlacement loaded = store_placement(store, replicated, coordinates_of(replicated, world.rank()));
    std::vector<float> moments(2 * store.size());
    for (StateRange& run : loaded.updated) {
      run.exp_avg = moments.data() + (run.master - static_cast<float*>(store.values()));
      run.exp_avg_sq = run.exp_avg + store.size();
    }
    TrainingState state{.placement = loaded};
    EXPECT_EQ(load_checkpoint(dir, state, scope()), path);
    EXPECT_EQ(state.step, 7);
    EXPECT_EQ(state.optimizer_step, 6);
    EXPECT_EQ(state.data_position, 112);
    for (const StateRange& run : loaded.updated)
      for (std::int64_t i = 0; i < run.count; ++i) {
        ASSERT_EQ(run.master[i], value_of(*run.tensor, run.offset + i, 0)) << run.tensor->path;
        ASSERT_EQ(run.exp_avg_sq[i], value_of(*run.tensor, run.offset + i, 2)) << run.tensor->path;
      }

    // The joined checksum is the CRC-32 of the whole tensor.
    if (world.rank() == 0) {
      Hdf5Handle file = file_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
      const ParameterTensor& weight = store.tensor("layers/01/weight");
      Hdf5Handle dataset = dataset_handle(H5Dopen2(file.get(), "/model/layers/01/weight", H5P_DEFAULT));
      Hdf5Handle attribute = attribute_handle(H5Aopen(dataset.get(), "crc32", H5P_DEFAULT));
      std::uint32_t stored = 0;
      H5Aread(attribute.get(), H5T_NATIVE_UINT32, &stored);
      const auto expected = crc32(0L, reinterpret_cast<const Bytef*>(store.value_at(weight.offset)),
                                  static_cast<uInt>(weight.count * sizeof(float)));
      EXPECT_EQ(stored, expected);
      std::filesystem::remove_all(dir);
    }
    world.barrier();
  }
};

}  // namespace

TEST_F(CheckpointTest, FlatShardsLoadWholeInAnotherLayout) { round_trip(flat_shards()); }

TEST_F(CheckpointTest, ColumnBlocksLoadWholeInAnotherLayout) { round_trip(column_blocks()); }

// Each copy writes its slice: a copy writing all of it would overlap, and one leaving its slice
// out would leave a gap; either is refused.
TEST_F(CheckpointTest, ReplicasWriteEachElementOnce) { round_trip(replicated()); }

TEST_F(CheckpointTest, PiecesThatLeaveAGapAreRefused) {
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks to leave another rank's piece out";
  Layout pieces = flat_shards();
  if (world.rank() == 1) pieces.placement.updated.clear();  // rank 1 drops its shard
  pieces.fill();
  const std::string dir = directory();
  EXPECT_THROW(save_checkpoint(dir, {.placement = pieces.placement, .step = 1, .data_position = 1}, {}, scope()),
               RuntimeFailure);
}

// A checkpoint is published only of finite numbers: one infinite moment on the last rank stops
// the save on every rank, and neither the file nor its partial one is left behind.
TEST_F(CheckpointTest, AStateThatIsNotFiniteIsNotPublished) {
  Layout pieces = flat_shards();
  pieces.fill();
  if (world.rank() == world.size() - 1) pieces.placement.updated.back().exp_avg_sq[0] = INFINITY;
  const std::string dir = directory() + "-not-finite";
  if (world.rank() == 0) prepare_checkpoint_directory(dir);
  world.barrier();
  try {
    save_checkpoint(dir, {.placement = pieces.placement, .step = 7, .data_position = 1}, {}, scope());
    ADD_FAILURE() << "a state that is not finite was saved";
  } catch (const AgreedError& error) {
    EXPECT_NE(std::string(error.what()).find("step 7: 1 numbers of the parameters and optimizer state are not finite"),
              std::string::npos)
        << error.what();
  }
  world.barrier();
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_00000007.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/.step_00000007.h5.partial"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest"));
}

TEST_F(CheckpointTest, HalfParametersLoadTheMastersAndRoundTheirValues) {
  Layout written = flat_shards();
  written.fill();
  const std::string dir = directory() + "-half";
  if (world.rank() == 0) prepare_checkpoint_directory(dir);
  world.barrier();
  save_checkpoint(dir, {.placement = written.placement, .step = 3, .optimizer_step = 3, .data_position = 48},
                  {.config_ini = "layers = 3\n", .layout = "test", .seed = 1}, scope());
  // Whole on every rank, with bf16 values and the masters and moments beside them.
  const Precision precision{.param = DataType::bfloat16, .reduce = DataType::float32};
  ParameterStore store(whole, allocator, {}, precision);
  const GridShape replicated{.world = world.size(), .tp = 1, .dp = world.size(), .pp = 1, .ep = 1};
  StatePlacement loaded = store_placement(store, replicated, coordinates_of(replicated, world.rank()));
  std::vector<float> optimizer(3 * store.size());
  for (StateRange& run : loaded.updated) {
    run.master = optimizer.data() + run.moment_offset;
    run.exp_avg = run.master + store.size();
    run.exp_avg_sq = run.exp_avg + store.size();
  }
  TrainingState state{.placement = loaded};
  load_checkpoint(dir, state, scope());
  for (const StateRange& run : loaded.updated)
    for (std::int64_t i = 0; i < run.count; ++i) {
      const float stored = value_of(*run.tensor, run.offset + i, 0);
      ASSERT_EQ(run.master[i], stored) << run.tensor->path;
      ASSERT_EQ(load_element(run.values, static_cast<std::size_t>(i), DataType::bfloat16),
                bfloat16_to_float(round_to_bfloat16(stored)))
          << run.tensor->path;
      ASSERT_EQ(run.exp_avg[i], value_of(*run.tensor, run.offset + i, 1)) << run.tensor->path;
    }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
