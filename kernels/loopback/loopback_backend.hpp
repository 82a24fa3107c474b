// The loopback device: the CPU kernels on host memory that the host may only reach through the
// allocator's copies. Its pointers carry a tag bit that makes them non-canonical addresses, so
// any host code that reads or writes device memory directly crashes at once, and a kernel handed
// a host pointer stops with a message. Runs on it take the device path of a GPU run (uploads,
// downloads, host-staged communication) and give the CPU's numbers, so that path is checked on
// every machine.
#pragma once

#include <memory>

#include "core/buffer.hpp"
#include "kernels/kernels.hpp"

namespace mlptrain {

std::unique_ptr<Allocator> make_loopback_allocator(MemoryLedger& ledger);
std::unique_ptr<Kernels> make_loopback_kernels();

}  // namespace mlptrain
