// The MPI communicator at whatever world size mpiexec gives, on the calling thread and on a
// communication engine: every collective, blocking and not, exact results, and the ledger's sizes
// in nccl-tests' convention. Also the grid's groups,
// failure agreement and the rank-to-GPU placement.
#include <gtest/gtest.h>
#include <mpi.h>

#include <bit>
#include <numeric>

#include "comm/consensus.hpp"
#include "comm/gpu_placement.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/process_groups.hpp"

using namespace mlptrain;

namespace {

// Every test twice: operations on the calling thread, and as tasks of a communication engine.
class MpiCommunicatorTest : public ::testing::TestWithParam<bool> {
 protected:
  CommLedger ledger;
  std::unique_ptr<CommEngine> engine = GetParam() ? std::make_unique<CommEngine>() : nullptr;
  MpiCommunicator world{MPI_COMM_WORLD, "world", ledger, true, engine.get()};
  int rank = world.rank();
  int size = world.size();

  std::int64_t bytes_of(CommOp op) const { return ledger.run().bytes_of(op); }
};

}  // namespace

TEST_P(MpiCommunicatorTest, AllReduceSumMaxMinAcrossTypes) {
  std::vector<float> values = {1.0f * rank, 2.0f, -1.0f * rank};
  world.all_reduce(values.data(), values.size());
  const float total = size * (size - 1) / 2.0f;
  EXPECT_EQ(values, (std::vector<float>{total, 2.0f * size, -total}));
  std::int64_t largest = rank * 10;
  world.all_reduce(&largest, 1, ReduceOp::max);
  EXPECT_EQ(largest, (size - 1) * 10);
  double smallest = 5.0 - rank;
  world.all_reduce(&smallest, 1, ReduceOp::min);
  EXPECT_EQ(smallest, 5.0 - (size - 1));
  EXPECT_EQ(bytes_of(CommOp::all_reduce), 3 * 4 + 8 + 8);
  EXPECT_EQ(ledger.run().calls[static_cast<int>(CommOp::all_reduce)], 3);
}

TEST_P(MpiCommunicatorTest, ReduceScatterAndAllGather) {
  const std::size_t block = 3;
  std::vector<float> input(block * size);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i + rank);
  std::vector<float> shard(block);
  world.reduce_scatter(input.data(), shard.data(), block);
  for (std::size_t i = 0; i < block; ++i) {
    const float index = static_cast<float>(rank * block + i);
    EXPECT_EQ(shard[i], size * index + size * (size - 1) / 2.0f);
  }
  std::vector<std::int32_t> mine = {rank, -rank}, all(2 * size);
  world.all_gather(mine.data(), all.data(), 2);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], -r);
  }
  EXPECT_EQ(bytes_of(CommOp::reduce_scatter), static_cast<std::int64_t>(block * size * 4));
  EXPECT_EQ(bytes_of(CommOp::all_gather), 2 * size * 4);
}

// Reduce, gather and scatter to and from the first and the last rank, in place and not, blocking
// and started: the root holds the sum or every block, every rank its block of the root's buffer;
// the ledger counts nccl-tests' sizes (the buffer; the whole output; the whole input).
TEST_P(MpiCommunicatorTest, RootedOperationsInPlaceAndNot) {
  const std::size_t block = 3, total = block * static_cast<std::size_t>(size);
  const auto contribution = [](int source, std::size_t i) { return static_cast<float>(source * 10 + i); };
  for (const int root : {0, size - 1}) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "root " << root << (in_place ? ", in place" : ""));
      ledger.begin_step();
      // reduce: every rank's buffer of `total` summed at the root.
      std::vector<float> mine(total), sum(total, -1.0f);
      for (std::size_t i = 0; i < total; ++i) mine[i] = contribution(rank, i);
      Operation reduce{.op = CommOp::reduce, .send = mine.data(), .receive = in_place ? mine.data() : sum.data(),
                       .count = total, .peer = root};
      world.start(reduce).wait();
      if (rank == root) {
        for (std::size_t i = 0; i < total; ++i)
          EXPECT_EQ(reduce.receive == sum.data() ? sum[i] : mine[i],
                    size * static_cast<float>(i) + 10.0f * size * (size - 1) / 2.0f);
      }
      // gather: block r of the root's buffer is rank r's contribution.
      std::vector<float> own(in_place ? total : block, -1.0f), gathered(total, -1.0f);
      for (std::size_t i = 0; i < block; ++i) own[(in_place ? rank * block : 0) + i] = contribution(rank, i);
      world.run({.op = CommOp::gather, .send = own.data(), .receive = in_place ? own.data() : gathered.data(),
                 .count = block, .peer = root});
      const std::vector<float>& at_root = in_place ? own : gathered;
      if (rank == root) {
        for (std::size_t i = 0; i < total; ++i) EXPECT_EQ(at_root[i], contribution(static_cast<int>(i / block), i % block));
      }
      // scatter: rank r receives block r of the root's buffer.
      std::vector<float> source(total, -1.0f), received(in_place ? total : block, -2.0f);
      if (rank == root)
        for (std::size_t i = 0; i < total; ++i) source[i] = contribution(static_cast<int>(i / block), i % block) + 0.5f;
      if (in_place) received = source;
      world.run({.op = CommOp::scatter, .send = in_place ? received.data() : source.data(), .receive = received.data(),
                 .count = block, .peer = root});
      for (std::size_t i = 0; i < block; ++i)
        EXPECT_EQ(received[(in_place ? rank * block : 0) + i], contribution(rank, i) + 0.5f);
      EXPECT_EQ(ledger.step().bytes_of(CommOp::reduce), static_cast<std::int64_t>(total * 4));
      EXPECT_EQ(ledger.step().bytes_of(CommOp::gather), static_cast<std::int64_t>(total * 4));
      EXPECT_EQ(ledger.step().bytes_of(CommOp::scatter), static_cast<std::int64_t>(total * 4));
    }
  }
}

TEST_P(MpiCommunicatorTest, BroadcastFromTheLastRank) {
  std::vector<double> data(5, rank == size - 1 ? 3.25 : 0.0);
  world.broadcast(data.data(), data.size(), size - 1);
  EXPECT_EQ(data, std::vector<double>(5, 3.25));
  EXPECT_EQ(bytes_of(CommOp::broadcast), 40);
}

TEST_P(MpiCommunicatorTest, AllToAllEqualAndVariable) {
  std::vector<std::int64_t> send(2 * size), receive(2 * size);
  for (int r = 0; r < size; ++r) send[2 * r] = send[2 * r + 1] = 100 * rank + r;
  world.all_to_all(send.data(), receive.data(), 2);
  for (int r = 0; r < size; ++r) EXPECT_EQ(receive[2 * r], 100 * r + rank);
  EXPECT_EQ(bytes_of(CommOp::all_to_all), 2 * size * 8);

  // Rank r sends r + d + 1 values to rank d; each value says who sent it to whom.
  std::vector<std::size_t> send_counts(size), receive_counts(size);
  std::vector<float> packed;
  for (int d = 0; d < size; ++d) {
    send_counts[d] = rank + d + 1;
    receive_counts[d] = d + rank + 1;
    for (std::size_t k = 0; k < send_counts[d]; ++k) packed.push_back(rank * 10.0f + d);
  }
  std::vector<float> unpacked(std::accumulate(receive_counts.begin(), receive_counts.end(), std::size_t{0}));
  const std::int64_t before = bytes_of(CommOp::all_to_all);
  world.all_to_all_variable(packed.data(), send_counts, unpacked.data(), receive_counts);
  std::size_t at = 0;
  for (int s = 0; s < size; ++s)
    for (std::size_t k = 0; k < receive_counts[s]; ++k) EXPECT_EQ(unpacked[at++], s * 10.0f + rank);
  EXPECT_EQ(bytes_of(CommOp::all_to_all) - before, static_cast<std::int64_t>(packed.size() * 4));
}

TEST_P(MpiCommunicatorTest, SendAndReceiveAroundARing) {
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  std::vector<float> outgoing(4, static_cast<float>(rank)), incoming(4, -1.0f);
  Request receive = world.start({.op = CommOp::recv, .receive = incoming.data(), .count = 4,
                                 .type = DataType::float32, .peer = previous, .tag = 7});
  world.send(outgoing.data(), 4, next, 7);
  receive.wait();
  EXPECT_EQ(incoming, std::vector<float>(4, static_cast<float>(previous)));
  EXPECT_EQ(bytes_of(CommOp::send), 16);
  EXPECT_EQ(bytes_of(CommOp::recv), 16);
}

TEST_P(MpiCommunicatorTest, NonBlockingCollectivesCompleteAndAreRecorded) {
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f), gathered(size), shard(1), scatter_input(size, 1.0f);
  float one = static_cast<float>(rank);
  Request first = world.all_reduce_async(a.data(), a.size());
  Request second = world.all_reduce_async(b.data(), b.size());
  Request third = world.start({.op = CommOp::all_gather, .send = &one, .receive = gathered.data(),
                               .count = 1, .type = DataType::float32});
  Request fourth = world.start({.op = CommOp::reduce_scatter, .send = scatter_input.data(),
                                .receive = shard.data(), .count = 1, .type = DataType::float32});
  while (!first.test()) {
  }
  EXPECT_TRUE(first.done());
  second.wait();
  third.wait();
  fourth.wait();
  EXPECT_EQ(a, std::vector<float>(1000, static_cast<float>(size)));
  EXPECT_EQ(b, std::vector<float>(1000, 2.0f * size));
  for (int r = 0; r < size; ++r) EXPECT_EQ(gathered[r], static_cast<float>(r));
  EXPECT_EQ(shard[0], static_cast<float>(size));
  EXPECT_EQ(bytes_of(CommOp::all_reduce), 8000);
  EXPECT_EQ(bytes_of(CommOp::all_gather), 4 * size);
  EXPECT_EQ(ledger.by_group().at("world").bytes_of(CommOp::all_reduce), 8000);
  world.barrier();
}

TEST_P(MpiCommunicatorTest, GridGroupsSumOverTheirOwnRanks) {
  if (size % 2 != 0) GTEST_SKIP() << "needs an even world size";
  const GridShape shape{.world = size, .tp = 2, .dp = size / 2, .pp = 1, .ep = 1};
  ProcessGroups groups(MPI_COMM_WORLD, shape, ledger, engine.get());
  std::int64_t value = rank;
  groups.group(GroupKind::tensor).all_reduce(&value, 1);
  const int tp_first = rank - rank % 2;
  EXPECT_EQ(value, tp_first + tp_first + 1);
  value = rank;
  groups.group(GroupKind::data).all_reduce(&value, 1);
  std::int64_t expected = 0;
  for (int r = rank % 2; r < size; r += 2) expected += r;
  EXPECT_EQ(value, expected);
  EXPECT_EQ(groups.group(GroupKind::data).size(), size / 2);
  EXPECT_GT(ledger.by_group().at("tp").bytes_of(CommOp::all_reduce), 0);
}

TEST_P(MpiCommunicatorTest, ReductionMemoryIsSummedInPlaceWithManyOperationsInFlight) {
  MemoryLedger memory;
  HostAllocator allocator(memory);
  const std::size_t total = 100003;  // several chunks, not a multiple of any of them
  Buffer buffer = world.allocate_collective_memory(allocator, MemoryState::grads, total * sizeof(float));
  EXPECT_EQ(memory.current(MemoryState::grads), static_cast<std::int64_t>(total * sizeof(float)));
  float* data = buffer.floats();
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < total; ++i) data[i] = static_cast<float>((i % 97) * (rank + 1) + round);
    // Ranges of different sizes, posted back to back and completed out of order.
    const std::size_t cuts[] = {0, 1, 70000, 70001, 99000, total};
    std::vector<Request> requests;
    for (std::size_t piece = 0; piece + 1 < std::size(cuts); ++piece)
      requests.push_back(world.all_reduce_async(data + cuts[piece], cuts[piece + 1] - cuts[piece]));
    for (std::size_t piece = requests.size(); piece-- > 0;) requests[piece].wait();
    const float rank_factor = size * (size + 1) / 2.0f;
    for (std::size_t i = 0; i < total; ++i)
      ASSERT_EQ(data[i], static_cast<float>(i % 97) * rank_factor + size * round) << i;
  }
  // A blocking sum of the same memory, and every rank holds the same bits.
  world.all_reduce(data, total);
  std::uint64_t checksum = 0;
  for (std::size_t i = 0; i < total; ++i) checksum = checksum * 31 + std::bit_cast<std::uint32_t>(data[i]);
  std::uint64_t lowest = checksum, highest = checksum;
  world.all_reduce(&lowest, 1, ReduceOp::min);
  world.all_reduce(&highest, 1, ReduceOp::max);
  EXPECT_EQ(lowest, highest);
  EXPECT_EQ(bytes_of(CommOp::all_reduce), static_cast<std::int64_t>(4 * total * 4 + 16));
}

TEST_P(MpiCommunicatorTest, InPlaceReduceScatterAndAllGatherInAndOutOfSharedMemory) {
  MemoryLedger memory;
  HostAllocator allocator(memory);
  const std::size_t block = 40001;  // several chunks per block, not a multiple of any
  const std::size_t total = block * size;
  Buffer shared = world.allocate_collective_memory(allocator, MemoryState::grads, total * sizeof(float));
  std::vector<float> private_memory(total);
  for (float* data : {shared.floats(), private_memory.data()}) {
    for (std::size_t i = 0; i < total; ++i) data[i] = static_cast<float>(i % 101) + rank;
    Request scatter = world.reduce_scatter_in_place_async(data, block, DataType::float32);
    scatter.wait();
    const float ranks_sum = size * (size - 1) / 2.0f;
    for (std::size_t i = rank * block; i < (rank + 1) * block; ++i)
      ASSERT_EQ(data[i], static_cast<float>(i % 101) * size + ranks_sum) << i;
    // Each rank's block now says who owns it; gather them everywhere.
    for (std::size_t i = rank * block; i < (rank + 1) * block; ++i) data[i] = rank * 1000.0f + i % 7;
    Request gather = world.all_gather_in_place_async(data, block, DataType::float32);
    while (!gather.test()) {
    }
    for (std::size_t i = 0; i < total; ++i)
      ASSERT_EQ(data[i], static_cast<float>(i / block) * 1000.0f + i % 7) << i;
  }
  EXPECT_EQ(bytes_of(CommOp::reduce_scatter), static_cast<std::int64_t>(2 * total * 4));
  EXPECT_EQ(bytes_of(CommOp::all_gather), static_cast<std::int64_t>(2 * total * 4));
}

TEST_P(MpiCommunicatorTest, MoreSharedOperationsInFlightThanSlots) {
  MemoryLedger memory;
  HostAllocator allocator(memory);
  const std::size_t operations = 1100, each = 20000;  // two chunks each
  Buffer buffer =
      world.allocate_collective_memory(allocator, MemoryState::grads, operations * each * sizeof(float));
  float* data = buffer.floats();
  std::fill_n(data, operations * each, 1.0f);
  std::vector<Request> requests;
  for (std::size_t operation = 0; operation < operations; ++operation)
    requests.push_back(world.all_reduce_async(data + operation * each, each));
  for (Request& request : requests) request.wait();
  for (std::size_t i = 0; i < operations * each; i += 997) ASSERT_EQ(data[i], static_cast<float>(size));
}

TEST_P(MpiCommunicatorTest, EveryRankAgreesOnTheLowestRanksError) {
  const auto problem = first_problem(world, rank == size - 1 ? std::optional<std::string>("last")
                                                              : std::nullopt);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(*problem, "last");
  EXPECT_FALSE(first_problem(world, std::nullopt).has_value());
  try {
    agree_or_throw(world, [&] {
      if (rank >= size / 2) throw UsageError("bad on rank " + std::to_string(rank));
    });
    FAIL() << "expected an agreed error";
  } catch (const AgreedError& error) {
    EXPECT_EQ(std::string(error.what()), "bad on rank " + std::to_string(size / 2));
    EXPECT_EQ(error.code(), ExitCode::usage);
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, MpiCommunicatorTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Engine" : "CallingThread"; });

TEST(GpuPlacement, RanksOfOneNodeShareItsGpusRoundRobin) {
  // mpiexec starts every rank on this node: the split finds them all.
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const NodePlace place = node_place(MPI_COMM_WORLD);
  EXPECT_EQ(place.local_rank, rank);
  EXPECT_EQ(place.local_ranks, size);
  EXPECT_EQ(choose_gpu(place, 1, false), 0);  // host staging: any number of ranks per GPU
  EXPECT_EQ(choose_gpu(place, 2, false), rank % 2);
  EXPECT_EQ(choose_gpu({.local_rank = 5, .local_ranks = 8}, 8, true), 5);
  EXPECT_THROW(choose_gpu(place, 0, false), UsageError);
  try {
    choose_gpu({.local_rank = 0, .local_ranks = 4}, 2, true);
    ADD_FAILURE() << "NCCL with two ranks per GPU was accepted";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("NCCL allows one rank per GPU"), std::string::npos);
  }
}
