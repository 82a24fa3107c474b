// The MPI backend of Communicator for host buffers: one MPI communicator per process group.
#pragma once

#include <mpi.h>

#include "comm/communicator.hpp"

namespace mlptrain {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, std::string group, CommLedger& ledger);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  MPI_Comm handle() const { return comm_; }

 protected:
  void run_backend(const Operation& operation) override;
  std::unique_ptr<PendingOperation> start_backend(const Operation& operation) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace mlptrain
