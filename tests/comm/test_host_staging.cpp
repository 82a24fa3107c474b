// Host staging at whatever world size mpiexec gives: every collective the strategies use, on
// loopback device memory (which the host cannot read directly) through a staged communicator,
// gives exactly what the same collective gives on host memory; blocking and started, in place
// and not, over many pieces, receives posted before their sends, many operations in flight on one
// channel, operations that reuse the host blocks the last ones left behind, and a started
// operation that the engine's thread completes while its caller computes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "comm/host_staging.hpp"
#include "comm/mpi_communicator.hpp"
#include "kernels/loopback/loopback_backend.hpp"

using namespace mlptrain;

namespace {

class HostStagingTest : public ::testing::Test {
 protected:
  MemoryLedger memory;
  std::unique_ptr<Allocator> device = make_loopback_allocator(memory);
  // 64-byte pieces: an operation of a few hundred floats goes through many of them.
  HostStaging staging{*device, 64};
  CommEngine engine;  // after the staging: it stops before the staging goes
  CommLedger ledger;
  // Both on the engine: its tasks issue the world's collectives in the order they were asked for.
  MpiCommunicator host{MPI_COMM_WORLD, "host", ledger, false, &engine};
  MpiCommunicator staged{MPI_COMM_WORLD, "staged", ledger, false, &engine, &staging};
  int rank = host.rank();
  int size = host.size();

  // Integer-valued floats: sums are exact in any order.
  std::vector<float> values(std::size_t count, int salt) const {
    std::vector<float> result(count);
    for (std::size_t i = 0; i < count; ++i) result[i] = static_cast<float>((i * 7 + salt * 13 + rank * 31) % 97);
    return result;
  }
  template <typename T>
  Buffer on_device(const std::vector<T>& data) {
    Buffer buffer = device->allocate(MemoryState::workspace, std::max<std::size_t>(data.size(), 1) * sizeof(T));
    device->copy_to_device(buffer.as<void>(), data.data(), data.size() * sizeof(T));
    return buffer;
  }
  template <typename T>
  std::vector<T> from_device(const Buffer& buffer, std::size_t count) {
    std::vector<T> data(count);
    device->copy_to_host(data.data(), buffer.as<void>(), count * sizeof(T));
    return data;
  }
};

}  // namespace

TEST_F(HostStagingTest, OnlyDeviceMemoryIsStaged) {
  Buffer on = on_device(values(4, 0));
  std::vector<float> off(4);
  EXPECT_TRUE(staging.stages({.op = CommOp::all_reduce, .send = on.as<void>(), .receive = on.as<void>(), .count = 4}));
  EXPECT_FALSE(staging.stages({.op = CommOp::all_reduce, .send = off.data(), .receive = off.data(), .count = 4}));
  EXPECT_TRUE(staging.stages({.op = CommOp::recv, .receive = on.as<void>(), .count = 4}));
  // A host world sum through the staged communicator still works as ever.
  double sum = rank;
  staged.all_reduce(&sum, 1);
  EXPECT_EQ(sum, size * (size - 1) / 2.0);
}

TEST_F(HostStagingTest, AllReduceInChunksInPlaceAndNot) {
  for (std::size_t count : {std::size_t{1}, std::size_t{16}, std::size_t{17}, std::size_t{500}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<float> expected = values(count, 1);
    host.all_reduce(expected.data(), count);
    Buffer data = on_device(values(count, 1));
    staged.all_reduce(data.floats(), count);
    EXPECT_EQ(from_device<float>(data, count), expected);
    Buffer source = on_device(values(count, 1)), target = on_device(std::vector<float>(count));
    staged.run({.op = CommOp::all_reduce, .send = source.as<void>(), .receive = target.as<void>(), .count = count});
    EXPECT_EQ(from_device<float>(target, count), expected);
    EXPECT_EQ(from_device<float>(source, count), values(count, 1));  // the input is left alone
  }
}

TEST_F(HostStagingTest, ReduceScatterAndAllGatherInPlaceAndNot) {
  const std::size_t block = 5, total = block * static_cast<std::size_t>(size);
  std::vector<float> shard(block);
  host.reduce_scatter(values(total, 2).data(), shard.data(), block);
  Buffer input = on_device(values(total, 2)), output = on_device(std::vector<float>(block));
  staged.reduce_scatter(input.floats(), output.floats(), block);
  EXPECT_EQ(from_device<float>(output, block), shard);
  // In place: this rank's block of the buffer receives its reduced block.
  Buffer in_place = on_device(values(total, 2));
  staged.run({.op = CommOp::reduce_scatter, .send = in_place.as<void>(), .receive = in_place.as<void>(), .count = block});
  const std::vector<float> after = from_device<float>(in_place, total);
  EXPECT_EQ(std::vector<float>(after.begin() + rank * block, after.begin() + (rank + 1) * block), shard);

  std::vector<float> gathered(total);
  host.all_gather(values(block, 3).data(), gathered.data(), block);
  Buffer mine = on_device(values(block, 3)), all = on_device(std::vector<float>(total));
  staged.all_gather(mine.floats(), all.floats(), block);
  EXPECT_EQ(from_device<float>(all, total), gathered);
  // In place: only this rank's block holds its contribution before.
  std::vector<float> own(total, -1.0f);
  const std::vector<float> contribution = values(block, 3);
  std::copy(contribution.begin(), contribution.end(), own.begin() + rank * block);
  Buffer together = on_device(own);
  staged.run({.op = CommOp::all_gather, .send = together.as<void>(), .receive = together.as<void>(), .count = block});
  EXPECT_EQ(from_device<float>(together, total), gathered);
}

// Reduce, gather and scatter on device memory, in place and not, with the last rank as root: what
// the root (or every rank, for scatter) holds equals the same operation on host memory.
TEST_F(HostStagingTest, RootedOperationsInPlaceAndNot) {
  const std::size_t block = 5, total = block * static_cast<std::size_t>(size);
  const int root = size - 1;
  for (const CommOp op : {CommOp::reduce, CommOp::gather, CommOp::scatter}) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(::testing::Message() << comm_op_name(op) << (in_place ? ", in place" : ""));
      // Host and device runs of the same operation: a buffer of `total` on every rank (`block`
      // where the operation takes or leaves one block and it is not in place).
      const std::size_t send_count = op == CommOp::gather && !in_place ? block : total;
      const std::size_t receive_count = op == CommOp::scatter && !in_place ? block : total;
      std::vector<float> host_send = values(send_count, 4), host_receive(receive_count, -1.0f);
      if (in_place) host_receive = host_send;
      host.run({.op = op, .send = host_send.data(), .receive = in_place ? host_send.data() : host_receive.data(),
                .count = op == CommOp::reduce ? total : block, .peer = root});
      Buffer send = on_device(values(send_count, 4)), receive = on_device(std::vector<float>(receive_count, -1.0f));
      void* device_receive = in_place ? send.as<void>() : receive.as<void>();
      staged.run({.op = op, .send = send.as<void>(), .receive = device_receive,
                  .count = op == CommOp::reduce ? total : block, .peer = root});
      const std::vector<float> expected = in_place ? host_send : host_receive;
      const std::vector<float> got = from_device<float>(in_place ? send : receive, expected.size());
      if (op == CommOp::scatter) {
        const std::size_t own = in_place ? static_cast<std::size_t>(rank) * block : 0;
        EXPECT_EQ(std::vector<float>(got.begin() + own, got.begin() + own + block),
                  std::vector<float>(expected.begin() + own, expected.begin() + own + block));
      } else if (rank == root) {
        EXPECT_EQ(got, expected);
      }
    }
  }
}

TEST_F(HostStagingTest, BroadcastAndAllToAllEqualAndVariable) {
  const int root = size - 1;
  std::vector<double> message(6, rank == root ? 2.5 : 0.0);
  Buffer broadcast = on_device(message);
  staged.broadcast(broadcast.as<double>(), message.size(), root);
  EXPECT_EQ(from_device<double>(broadcast, message.size()), std::vector<double>(6, 2.5));

  const auto ranks = static_cast<std::size_t>(size);
  std::vector<std::int32_t> send(3 * ranks), expected(3 * ranks);
  std::iota(send.begin(), send.end(), 100 * rank);
  host.all_to_all(send.data(), expected.data(), 3);
  Buffer out = on_device(send), in = on_device(std::vector<std::int32_t>(3 * ranks));
  staged.all_to_all(out.as<std::int32_t>(), in.as<std::int32_t>(), 3);
  EXPECT_EQ(from_device<std::int32_t>(in, 3 * ranks), expected);

  // Rank r sends r + d + 1 floats to rank d, as MoE dispatch does.
  std::vector<std::size_t> send_counts, receive_counts;
  for (int peer = 0; peer < size; ++peer) {
    send_counts.push_back(static_cast<std::size_t>(rank + peer + 1));
    receive_counts.push_back(static_cast<std::size_t>(peer + rank + 1));
  }
  const std::size_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t received = std::accumulate(receive_counts.begin(), receive_counts.end(), std::size_t{0});
  std::vector<float> variable_expected(received);
  host.all_to_all_variable(values(sent, 4).data(), send_counts, variable_expected.data(), receive_counts);
  Buffer variable_out = on_device(values(sent, 4)), variable_in = on_device(std::vector<float>(received));
  staged.all_to_all_variable(variable_out.floats(), send_counts, variable_in.floats(), receive_counts);
  EXPECT_EQ(from_device<float>(variable_in, received), variable_expected);
}

TEST_F(HostStagingTest, StartedOperationsReturnTheirResultOnCompletion) {
  // Receives posted before the sends they wait for, around a ring: a staged start must not block.
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  const std::size_t count = 40;
  Buffer incoming = on_device(std::vector<float>(count));
  Buffer outgoing = on_device(values(count, 5));
  Request receive = staged.start({.op = CommOp::recv, .receive = incoming.as<void>(), .count = count, .peer = previous});
  Request send = staged.start({.op = CommOp::send, .send = outgoing.as<void>(), .count = count, .peer = next});
  std::vector<float> reduced = values(count, 6);
  host.all_reduce(reduced.data(), count);
  Buffer sum = on_device(values(count, 6));
  Request all_reduce = staged.all_reduce_async(sum.floats(), count);
  const std::size_t block = 3, total = block * static_cast<std::size_t>(size);
  std::vector<float> shard(block);
  host.reduce_scatter(values(total, 7).data(), shard.data(), block);
  Buffer scattered = on_device(values(total, 7));
  Request reduce_scatter = staged.reduce_scatter_in_place_async(scattered.floats(), block, DataType::float32);
  std::vector<float> own(total, 0.0f), gathered(total);
  host.all_gather(values(block, 8).data(), gathered.data(), block);
  const std::vector<float> contribution = values(block, 8);
  std::copy(contribution.begin(), contribution.end(), own.begin() + rank * block);
  Buffer together = on_device(own);
  Request all_gather = staged.all_gather_in_place_async(together.floats(), block, DataType::float32);

  for (Request* request : {&receive, &send, &all_reduce, &reduce_scatter, &all_gather}) request->wait();
  std::vector<float> from_previous(count);
  for (std::size_t i = 0; i < count; ++i)
    from_previous[i] = static_cast<float>((i * 7 + 5 * 13 + previous * 31) % 97);
  EXPECT_EQ(from_device<float>(incoming, count), from_previous);
  EXPECT_EQ(from_device<float>(sum, count), reduced);
  const std::vector<float> after = from_device<float>(scattered, total);
  EXPECT_EQ(std::vector<float>(after.begin() + rank * block, after.begin() + (rank + 1) * block), shard);
  EXPECT_EQ(from_device<float>(together, total), gathered);
  // Staging changes where bytes go, not what the ledger counts.
  EXPECT_EQ(ledger.run().bytes_of(CommOp::recv), static_cast<std::int64_t>(count * 4));
}

// Staged operations take host blocks from a cache, holding what the last operation of their size
// left there: each result is this operation's alone.
TEST_F(HostStagingTest, ReusedHostBlocksCarryNothingOver) {
  const std::size_t block = 7, total = block * static_cast<std::size_t>(size);
  for (int salt : {9, 10, 11}) {
    SCOPED_TRACE("salt " + std::to_string(salt));
    std::vector<float> gathered(total), shard(block);
    host.all_gather(values(block, salt).data(), gathered.data(), block);
    host.reduce_scatter(values(total, salt).data(), shard.data(), block);
    Buffer mine = on_device(values(block, salt)), all = on_device(std::vector<float>(total));
    staged.all_gather(mine.floats(), all.floats(), block);
    EXPECT_EQ(from_device<float>(all, total), gathered);
    Buffer in_place = on_device(values(total, salt));
    Request started = staged.reduce_scatter_in_place_async(in_place.floats(), block, DataType::float32);
    started.wait();
    const std::vector<float> after = from_device<float>(in_place, total);
    EXPECT_EQ(std::vector<float>(after.begin() + rank * block, after.begin() + (rank + 1) * block), shard);
    // A receive into a block that held another message: only the sent values arrive.
    const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
    Buffer incoming = on_device(std::vector<float>(total, -1.0f)), outgoing = on_device(values(total, salt));
    Request receive = staged.start({.op = CommOp::recv, .receive = incoming.as<void>(), .count = total, .peer = previous});
    staged.run({.op = CommOp::send, .send = outgoing.as<void>(), .count = total, .peer = next});
    receive.wait();
    std::vector<float> from_previous(total);
    for (std::size_t i = 0; i < total; ++i)
      from_previous[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(salt) * 13 + previous * 31) % 97);
    EXPECT_EQ(from_device<float>(incoming, total), from_previous);
  }
}

// Many staged operations in flight at once, several on one channel (the world's collectives, and
// two messages to one peer with one tag), each of hundreds of pieces, so that the copier's lanes
// run out and copies wait for lanes to come back: each result is its own, whatever order the
// requests are waited for in.
TEST_F(HostStagingTest, ManyOperationsInFlightOnOneChannelKeepTheirOrder) {
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  const std::size_t count = 3000, block = 700, total = block * static_cast<std::size_t>(size);
  std::vector<float> first = values(count, 12), second = values(count, 13), shard(block);
  host.all_reduce(first.data(), count);
  host.all_reduce(second.data(), count);
  host.reduce_scatter(values(total, 14).data(), shard.data(), block);
  Buffer sum_first = on_device(values(count, 12)), sum_second = on_device(values(count, 13));
  Buffer scattered = on_device(values(total, 14));
  Buffer out_a = on_device(values(count, 15)), out_b = on_device(values(count, 16));
  Buffer in_a = on_device(std::vector<float>(count)), in_b = on_device(std::vector<float>(count));
  std::vector<Request> requests;
  requests.push_back(staged.start({.op = CommOp::recv, .receive = in_a.as<void>(), .count = count, .peer = previous, .tag = 3}));
  requests.push_back(staged.all_reduce_async(sum_first.floats(), count));
  requests.push_back(staged.start({.op = CommOp::send, .send = out_a.as<void>(), .count = count, .peer = next, .tag = 3}));
  requests.push_back(staged.reduce_scatter_in_place_async(scattered.floats(), block, DataType::float32));
  requests.push_back(staged.start({.op = CommOp::send, .send = out_b.as<void>(), .count = count, .peer = next, .tag = 3}));
  requests.push_back(staged.all_reduce_async(sum_second.floats(), count));
  requests.push_back(staged.start({.op = CommOp::recv, .receive = in_b.as<void>(), .count = count, .peer = previous, .tag = 3}));
  for (auto request = requests.rbegin(); request != requests.rend(); ++request) request->wait();
  EXPECT_EQ(from_device<float>(sum_first, count), first);
  EXPECT_EQ(from_device<float>(sum_second, count), second);
  const std::vector<float> after = from_device<float>(scattered, total);
  EXPECT_EQ(std::vector<float>(after.begin() + rank * block, after.begin() + (rank + 1) * block), shard);
  // Messages of one tag arrive in the order they were sent.
  const auto from = [&](int salt) {
    std::vector<float> expected(count);
    for (std::size_t i = 0; i < count; ++i)
      expected[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(salt) * 13 + previous * 31) % 97);
    return expected;
  };
  EXPECT_EQ(from_device<float>(in_a, count), from(15));
  EXPECT_EQ(from_device<float>(in_b, count), from(16));
}

// The engine's thread moves started operations on while their caller does not call into them:
// one rank starts an all-reduce on host memory (a message MPI moves only while someone calls
// into it) and a staged one, then neither tests nor waits until the other rank, whose waits need
// this rank's share, says (through a file, outside MPI) that its waits returned.
TEST_F(HostStagingTest, StartedOperationsProgressWhileTheCallerComputes) {
  if (!engine.threaded()) GTEST_SKIP() << "MPI gave less than MPI_THREAD_MULTIPLE";
  const std::size_t large = std::size_t{1} << 20, staged_count = 2000;
  std::vector<float> expected_large = values(large, 17), expected_staged = values(staged_count, 18);
  host.all_reduce(expected_large.data(), large);
  host.all_reduce(expected_staged.data(), staged_count);
  long long id = getpid();
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::filesystem::path signal = std::filesystem::temp_directory_path() / ("mlptrain_engine_" + std::to_string(id));
  std::vector<float> on_host = values(large, 17);
  Buffer on_device_memory = on_device(values(staged_count, 18));
  Request host_sum = host.all_reduce_async(on_host.data(), large);
  Request staged_sum = staged.all_reduce_async(on_device_memory.floats(), staged_count);
  bool seen = true;
  if (rank == 0) {
    // "Computing": no call into a communicator or MPI for up to 20 s.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(signal) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen = std::filesystem::exists(signal);
    host_sum.wait();
    staged_sum.wait();
    std::filesystem::remove(signal);
  } else {
    host_sum.wait();
    staged_sum.wait();
    if (rank == 1) std::ofstream(signal) << "done\n";
  }
  EXPECT_TRUE(seen) << "rank 1's waits did not return while rank 0 computed";
  EXPECT_EQ(on_host, expected_large);
  EXPECT_EQ(from_device<float>(on_device_memory, staged_count), expected_staged);
  MPI_Barrier(MPI_COMM_WORLD);
}
