// commbench: the collectives the strategies use, timed over message sizes in the spirit of
// nccl-tests (DESIGN.md §2.6). For each collective and size it runs warm-up iterations, times the
// timed ones (the slowest rank's mean), checks one more run's result exactly against values every
// rank can compute, and prints time, algorithm bandwidth (size / time) and bus bandwidth (algbw
// times nccl-tests' bus factor) as a table, or one JSON object per measurement with --json.
// Sizes follow nccl-tests' size column: the buffer for all-reduce and broadcast, the whole output
// for all-gather, the whole input for reduce-scatter, what a rank sends for all-to-all and
// send/recv. The path `mpi-host` is MPI on host buffers; `mpi-staged` is MPI on device buffers
// staged through host memory (--device cuda, or loopback to check the path without a GPU);
// `nccl` is NCCL on GPU buffers, one rank per GPU. Both device paths get their communicator as
// the trainer does (compute_device.hpp). --dtype fp32|bf16|fp16 sets the element type, as the
// trainer's gradients and activations have it (half sums are the communicators' own: fp32 sums
// rounded once where a backend can, pairwise otherwise), and each measurement names it.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <fmt/format.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/consensus.hpp"
#include "comm/mpi_program.hpp"
#include "core/error.hpp"
#include "core/half_float.hpp"
#include "core/timer.hpp"
#include "train/compute_device.hpp"

namespace {

using namespace mlptrain;

struct Settings {
  std::vector<std::string> collectives;
  std::string path = "mpi-host";
  DataType dtype = DataType::float32;
  std::string device = "cuda";  // of the staged path
  std::int64_t chunk_bytes = 4 << 20;  // of the staged path's all-reduce pipeline; 0: one chunk
  std::int64_t min_bytes = 8;
  std::int64_t max_bytes = std::int64_t{256} << 20;
  int step_factor = 2;
  int iterations = 20;
  int warmup = 5;
  bool json = false;
  bool help = false;
  std::string help_text;
};

const std::vector<std::string> all_collectives = {"all_reduce", "reduce_scatter", "all_gather",
                                                  "all_to_all", "broadcast", "send_recv"};
// Not collectives: each rank's background copies between its device buffer and page-locked host
// memory (the device's copier, as host staging uses it), timed beside them on the device paths.
const std::vector<std::string> device_copies = {"copy_to_host", "copy_to_device"};

bool is_copy(const std::string& name) {
  return std::find(device_copies.begin(), device_copies.end(), name) != device_copies.end();
}

// "256M", "64K", "8" -> bytes.
std::int64_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("'{}' is not a size in bytes (e.g. 8, 64K, 256M)", text));
  }
  const std::string suffix = text.substr(used);
  const std::int64_t scale = suffix.empty() ? 1 : suffix == "K" ? 1 << 10 : suffix == "M" ? 1 << 20
                                              : suffix == "G" ? std::int64_t{1} << 30 : 0;
  if (scale == 0 || value < 0)
    throw UsageError(fmt::format("'{}' is not a size in bytes (e.g. 8, 64K, 256M)", text));
  return value * scale;
}

Settings parse(int argc, char** argv) {
  namespace po = boost::program_options;
  Settings settings;
  std::string collectives = "all", min_bytes = "8", max_bytes = "256M", chunk_bytes = "4M", dtype = "fp32";
  po::options_description options("commbench options");
  options.add_options()
      ("help", "print this help")
      ("collectives", po::value(&collectives)->default_value(collectives),
       "comma-separated: all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send_recv, or all; "
       "on a device path also copy_to_host, copy_to_device (each rank's pinned copies)")
      ("path", po::value(&settings.path)->default_value(settings.path), "mpi-host | mpi-staged | nccl")
      ("dtype", po::value(&dtype)->default_value(dtype), "element type: fp32 | bf16 | fp16")
      ("device", po::value(&settings.device)->default_value(settings.device),
       "device of mpi-staged buffers: cuda | loopback (the CPU behind device-style memory); nccl needs cuda")
      ("chunk-bytes", po::value(&chunk_bytes)->default_value(chunk_bytes),
       "mpi-staged all-reduce chunk size; 0 stages the whole message at once")
      ("min-bytes", po::value(&min_bytes)->default_value(min_bytes), "smallest size (K, M, G suffixes)")
      ("max-bytes", po::value(&max_bytes)->default_value(max_bytes), "largest size")
      ("step-factor", po::value(&settings.step_factor)->default_value(settings.step_factor),
       "each size is the previous one times this")
      ("iterations", po::value(&settings.iterations)->default_value(settings.iterations), "timed iterations per size")
      ("warmup", po::value(&settings.warmup)->default_value(settings.warmup), "untimed iterations first")
      ("json", po::bool_switch(&settings.json), "one JSON object per measurement");
  po::variables_map values;
  try {
    po::store(po::parse_command_line(argc, argv, options), values);
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(error.what());
  }
  settings.help = values.count("help") > 0;
  std::ostringstream help;
  help << "usage: mpiexec -n N commbench [options]\n" << options;
  settings.help_text = help.str();
  settings.min_bytes = parse_bytes(min_bytes);
  settings.max_bytes = parse_bytes(max_bytes);
  settings.chunk_bytes = chunk_bytes == "0" ? 0 : parse_bytes(chunk_bytes);
  const auto element = parse_choice<DataType>(dtype);
  if (!element) throw UsageError(fmt::format("unknown --dtype '{}' (fp32, bf16 or fp16)", dtype));
  settings.dtype = *element;
  if (settings.min_bytes < 1 || settings.min_bytes > settings.max_bytes)
    throw UsageError(fmt::format("--min-bytes {} must be at least 1 and at most --max-bytes {}", min_bytes, max_bytes));
  if (settings.step_factor < 2) throw UsageError("--step-factor must be at least 2");
  if (settings.iterations < 1 || settings.warmup < 0)
    throw UsageError("--iterations must be at least 1 and --warmup at least 0");
  if (settings.path != "mpi-host" && settings.path != "mpi-staged" && settings.path != "nccl")
    throw UsageError(fmt::format("unknown --path '{}' (mpi-host, mpi-staged or nccl)", settings.path));
  if (collectives == "all") {
    settings.collectives = all_collectives;
  } else {
    std::stringstream list(collectives);
    for (std::string name; std::getline(list, name, ',');) {
      if (std::find(all_collectives.begin(), all_collectives.end(), name) == all_collectives.end() &&
          !is_copy(name))
        throw UsageError(fmt::format("unknown collective '{}' in --collectives", name));
      if (is_copy(name) && settings.path == "mpi-host")
        throw UsageError(fmt::format("{} times a device's copies: it needs --path mpi-staged or nccl", name));
      settings.collectives.push_back(name);
    }
  }
  if (settings.device != "cuda" && settings.device != "loopback")
    throw UsageError(fmt::format("unknown --device '{}' (cuda or loopback)", settings.device));
  if (settings.path == "nccl" && settings.device != "cuda")
    throw UsageError("--path nccl moves GPU buffers: it needs --device cuda");
  return settings;
}

// A value every rank can compute for (rank, element): small integers below `range`, chosen so that
// a sum over every rank stays an integer the element type holds exactly (bf16: up to 256).
float value(int rank, std::size_t element, int range) {
  return static_cast<float>((rank * 7 + static_cast<int>(element % 61) * 3) % range);
}

// One collective at one size: buffers, the operation, and what this rank must hold afterwards.
// With a device, the operation runs on device copies of the buffers (a copy moves the send
// buffer to pinned memory, or pinned memory to the receive buffer, through `copier`).
class Case {
 public:
  Case(const std::string& collective, std::int64_t bytes, DataType type, Communicator& group, Allocator* device,
       AsyncCopier* copier)
      : collective_(collective), type_(type), group_(group), device_(device), copier_(copier) {
    const int ranks = group.size(), rank = group.rank();
    const bool per_rank = collective == "reduce_scatter" || collective == "all_gather" ||
                          collective == "all_to_all";
    const std::size_t element = size_of(type);
    range_ = type == DataType::float32 ? 64 : std::clamp(256 / ranks, 2, 64);
    count_ = static_cast<std::size_t>(bytes) / element / static_cast<std::size_t>(per_rank ? ranks : 1);
    const std::size_t whole = count_ * (per_rank ? ranks : 1);
    bytes_ = static_cast<std::int64_t>(whole * element);
    send_.resize((collective == "all_gather" ? count_ : whole) * element);
    receive_.resize((collective == "reduce_scatter" ? count_ : whole) * element);
    expected_.resize(receive_.size() / element);
    if (device_ != nullptr) {
      send_device_ = device_->allocate(MemoryState::comm_buffers, send_.size());
      receive_device_ = device_->allocate(MemoryState::comm_buffers, receive_.size());
    }
    if (is_copy(collective)) pinned_ = copier_->host_memory().allocate(MemoryState::comm_buffers, whole * element);
    const auto n = static_cast<std::size_t>(ranks);
    const auto r = static_cast<std::size_t>(rank);
    const auto of = [this](int source, std::size_t index) { return value(source, index, range_); };
    for (std::size_t index = 0; index < expected_.size(); ++index) {
      float sum = 0;
      if (collective == "all_reduce") {
        for (int source = 0; source < ranks; ++source) sum += of(source, index);
      } else if (collective == "reduce_scatter") {
        for (int source = 0; source < ranks; ++source) sum += of(source, r * count_ + index);
      } else if (collective == "all_gather") {
        sum = of(static_cast<int>(index / count_), index % count_);
      } else if (collective == "all_to_all") {  // block s came from rank s: its block for me
        sum = of(static_cast<int>(index / count_), r * count_ + index % count_);
      } else if (collective == "broadcast") {
        sum = of(0, index);
      } else if (is_copy(collective)) {
        sum = of(rank, index);
      } else {  // send_recv around the ring: from the previous rank
        sum = of(static_cast<int>((r + n - 1) % n), index);
      }
      expected_[index] = sum;
    }
  }

  std::int64_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }

  // The inputs; a broadcast's buffer is its receive buffer, holding the data at the root.
  void fill() {
    const int rank = group_.rank();
    for (std::size_t index = 0; index < send_.size() / size_of(type_); ++index)
      store_element(send_.data(), index, type_, value(rank, index, range_));
    for (std::size_t index = 0; index < expected_.size(); ++index) {
      const float initial = collective_ == "broadcast" && rank == 0 ? value(0, index, range_) : -1.0f;
      store_element(receive_.data(), index, type_, initial);
      if (!pinned_.empty())
        store_element(pinned_.as<void>(), index, type_, collective_ == "copy_to_device" ? value(rank, index, range_) : -1.0f);
    }
    if (device_ == nullptr) return;
    device_->copy_to_device(send_device_.as<void>(), send_.data(), send_.size());
    device_->copy_to_device(receive_device_.as<void>(), receive_.data(), receive_.size());
  }

  void run() {
    const int ranks = group_.size(), rank = group_.rank();
    void* send = device_ != nullptr ? send_device_.as<void>() : send_.data();
    void* receive = device_ != nullptr ? receive_device_.as<void>() : receive_.data();
    const auto operation = [&](CommOp op) {
      return Operation{.op = op, .send = send, .receive = receive, .count = count_, .type = type_};
    };
    if (collective_ == "copy_to_host") {
      copier_->start_to_host(0, pinned_.as<void>(), send, static_cast<std::size_t>(bytes_));
      copier_->wait_to_host(0);
    } else if (collective_ == "copy_to_device") {
      copier_->start_to_device(0, receive, pinned_.as<void>(), static_cast<std::size_t>(bytes_));
      copier_->wait_to_device(0);
    } else if (collective_ == "all_reduce" || collective_ == "reduce_scatter" || collective_ == "all_gather" ||
               collective_ == "all_to_all") {
      group_.run(operation(collective_ == "all_reduce"       ? CommOp::all_reduce
                           : collective_ == "reduce_scatter" ? CommOp::reduce_scatter
                           : collective_ == "all_gather"     ? CommOp::all_gather
                                                             : CommOp::all_to_all));
    } else if (collective_ == "broadcast") {
      Operation broadcast = operation(CommOp::broadcast);
      broadcast.send = nullptr;
      broadcast.count = expected_.size();
      group_.run(broadcast);
    } else {
      Operation received = operation(CommOp::recv), sent = operation(CommOp::send);
      received.send = nullptr;
      received.peer = (rank + ranks - 1) % ranks;
      sent.receive = nullptr;
      sent.peer = (rank + 1) % ranks;
      Request receiving = group_.start(received), sending = group_.start(sent);
      sending.wait();
      receiving.wait();
    }
  }

  bool correct() {
    const void* result = receive_.data();
    if (collective_ == "copy_to_host") {
      result = pinned_.as<void>();
    } else if (device_ != nullptr) {
      device_->copy_to_host(receive_.data(), receive_device_.as<void>(), receive_.size());
    }
    for (std::size_t index = 0; index < expected_.size(); ++index)
      if (load_element(result, index, type_) != expected_[index]) return false;
    return true;
  }

  // nccl-tests' bus factor: what each rank's link carries relative to the size.
  double bus_factor() const {
    const double n = group_.size();
    if (collective_ == "all_reduce") return 2 * (n - 1) / n;
    if (collective_ == "broadcast" || collective_ == "send_recv" || is_copy(collective_)) return 1;
    return (n - 1) / n;
  }

 private:
  std::string collective_;
  DataType type_;
  Communicator& group_;
  std::size_t count_ = 0;
  std::int64_t bytes_ = 0;
  int range_ = 64;
  std::vector<std::byte> send_, receive_;
  std::vector<float> expected_;
  Allocator* device_ = nullptr;
  AsyncCopier* copier_ = nullptr;
  Buffer send_device_, receive_device_, pinned_;
};

void measure(const Settings& settings, Communicator& world, Allocator* device) {
  const int rank = world.rank();
  if (rank == 0 && !settings.json) {
    std::printf("# commbench: path %s%s, %s elements, %d rank(s), %d iterations after %d warm-up\n",
                settings.path.c_str(), device != nullptr ? (" on " + settings.device).c_str() : "",
                std::string(data_type_name(settings.dtype)).c_str(), world.size(), settings.iterations,
                settings.warmup);
    std::printf("# %-15s %12s %12s %12s %12s %8s\n", "collective", "bytes", "time_us", "algbw_GB/s",
                "busbw_GB/s", "correct");
  }
  int failures = 0;
  const std::unique_ptr<AsyncCopier> copier = device != nullptr ? device->make_async_copier(1) : nullptr;
  for (const std::string& collective : settings.collectives) {
    for (std::int64_t size = settings.min_bytes; size <= settings.max_bytes; size *= settings.step_factor) {
      Case current(collective, size, settings.dtype, world, device, copier.get());
      if (current.empty()) continue;  // smaller than one element per rank
      current.fill();
      for (int iteration = 0; iteration < settings.warmup; ++iteration) current.run();
      world.barrier();
      const double start_ms = now_ms();
      for (int iteration = 0; iteration < settings.iterations; ++iteration) current.run();
      double time_us = (now_ms() - start_ms) * 1000.0 / settings.iterations;
      current.fill();
      current.run();
      int correct = current.correct() ? 1 : 0;
      world.all_reduce(&time_us, 1, ReduceOp::max);
      world.all_reduce(&correct, 1, ReduceOp::min);
      failures += correct == 0;
      const double algbw = static_cast<double>(current.bytes()) / (time_us * 1e3);  // GB/s
      const double busbw = algbw * current.bus_factor();
      if (rank != 0) continue;
      if (settings.json) {
        nlohmann::json row = {{"collective", collective}, {"path", settings.path},
                                    {"device", device != nullptr ? settings.device : "cpu"},
                                    {"dtype", data_type_name(settings.dtype)},
                                    {"bytes", current.bytes()}, {"ranks", world.size()},
                                    {"time_us", time_us}, {"algbw_gbps", algbw},
                                    {"busbw_gbps", busbw}, {"correct", correct == 1}};
        if (settings.path == "mpi-staged") row["chunk_bytes"] = settings.chunk_bytes;
        std::printf("%s\n", row.dump().c_str());
      } else {
        std::printf("  %-15s %12lld %12.2f %12.3f %12.3f %8s\n", collective.c_str(),
                    static_cast<long long>(current.bytes()), time_us, algbw, busbw,
                    correct == 1 ? "yes" : "NO");
      }
      std::fflush(stdout);
    }
  }
  if (failures > 0)
    throw AgreedError(ExitCode::runtime_failure,
                      fmt::format("{} measurement(s) gave wrong results", failures));
}

}  // namespace

int main(int argc, char** argv) {
  // Plain host buffers: MPI's own collectives, not the shared-memory window of collective memory.
  return run_mpi_program(argc, argv, "commbench", [&](MpiCommunicator& world) {
    Settings settings;
    agree_or_throw(world, [&] { settings = parse(argc, argv); });
    if (settings.help) {
      if (world.rank() == 0) std::fputs(settings.help_text.c_str(), stdout);
    } else if (settings.path == "mpi-host") {
      measure(settings, world, nullptr);
    } else {
      // Device buffers on a communicator of their own: MPI staging them through host memory, or
      // NCCL.
      Config config;
      config.device = settings.device == "cuda" ? Device::cuda : Device::loopback;
      config.comm = settings.path == "nccl" ? CommBackend::nccl : CommBackend::mpi;
      MemoryLedger memory, host_memory;
      CommLedger ledger;
      ComputeDevice device;
      std::unique_ptr<Communicator> communicator;
      agree_or_throw(world, [&] {
        device = open_compute_device(config, MPI_COMM_WORLD, memory, host_memory);
        if (device.staging)
          device.staging = std::make_unique<HostStaging>(
              *device.memory, settings.chunk_bytes > 0 ? static_cast<std::size_t>(settings.chunk_bytes)
                                                       : std::numeric_limits<std::size_t>::max());
      });
      agree_or_throw(world, [&] {
        MPI_Comm comm = MPI_COMM_NULL;
        MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        communicator = communicator_factory(config, device, ledger, {.shared_memory = false})(comm, "world");
      });
      measure(settings, *communicator, device.memory.get());
    }
  });
}
