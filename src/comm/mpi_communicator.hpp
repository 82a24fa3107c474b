// The MPI backend of Communicator: one MPI communicator per process group. When all the group's
// ranks share a node, collective memory comes from MPI-3 shared-memory windows, and float
// all-reduces, reduce-scatters and all-gathers of buffers inside them are done in place there
// (see shared_window.hpp); all else goes through MPI's non-blocking collectives and
// point-to-point calls. With a communication engine (comm_engine.hpp), every operation, blocking
// or started, is a task of the engine, and operations on device memory flow through host staging
// (host_staging.hpp); without one (a program's setup, tests of MPI itself), operations run on
// the calling thread and a started one advances only while its caller tests or waits.
#pragma once

#include <mpi.h>

#include <optional>

#include "comm/comm_engine.hpp"
#include "comm/communicator.hpp"
#include "comm/host_staging.hpp"
#include "comm/mpi_types.hpp"
#include "comm/shared_window.hpp"

namespace mlptrain {

class MpiPending;


class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is predefined). Collective.
  // Without `shared_memory`, every operation goes through MPI (to compare with its collectives).
  // `engine` (may be null: the calling thread) runs the operations; `staging` (may be null: host
  // memory only; needs an engine) stages operations on a device's memory.
  MpiCommunicator(MPI_Comm comm, std::string group, CommLedger& ledger, bool shared_memory = true,
                  CommEngine* engine = nullptr, HostStaging* staging = nullptr);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  MPI_Comm handle() const { return comm_; }
  Buffer allocate_collective_memory(Allocator& fallback, MemoryState state,
                                    std::size_t bytes) override;

 protected:
  void run_backend(const Operation& operation) override;
  std::unique_ptr<PendingOperation> start_backend(const Operation& operation) override;

 private:
  // The operation as a task of the engine.
  std::unique_ptr<EngineTask> task(const Operation& operation);
  // The operation on host memory: in a shared window where it can be, else through MPI.
  std::unique_ptr<PendingOperation> start_on_host(const Operation& operation);
  // The operation done in a shared window, or null when it is not one that can be.
  std::unique_ptr<PendingOperation> start_shared(const Operation& operation);
  // The operation on host memory, through MPI.
  void run_host(const Operation& operation);
  std::unique_ptr<MpiPending> start_host(const Operation& operation);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  bool shared_memory_ = false;             // windows allowed (and more than one rank)
  std::optional<bool> shares_node_;        // every rank on this node: known once asked
  CommEngine* engine_ = nullptr;
  HostStaging* staging_ = nullptr;
  MpiHalfSums half_sums_;
  // One window per allocation; each window hands out its one segment.
  std::vector<std::unique_ptr<SharedWindow>> windows_;
  std::vector<std::unique_ptr<Allocator>> window_allocators_;
};

}  // namespace mlptrain
