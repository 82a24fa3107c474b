// The chunk pipeline of host-staged collectives (MPI on device buffers): a message is cut into
// chunks that go through three pinned host slots, so the device-to-host copy of chunk i+1, the
// MPI operation on chunk i and the host-to-device copy of chunk i-1 overlap (each in its own
// slot; with two, chunk i+1 would have to wait for chunk i-1 to leave). The order lives here,
// apart from CUDA: a copier moves chunks (asynchronously, on the device's copy streams), and a
// callback runs the MPI operation on a chunk in its host slot. All-reduces go this way
// (host_staging.hpp); the other operations stage whole. Where the device copies in the background
// (a GPU's copy streams, or the loopback device's copy threads) the stages overlap; elsewhere
// the copies complete as they start and the stages take turns.
#pragma once

#include <cstddef>
#include <functional>

namespace mlptrain {

inline constexpr int staging_slots = 3;

// Moves chunk `chunk` between the device buffer and host slot `slot` (0 .. staging_slots - 1).
class ChunkCopier {
 public:
  virtual ~ChunkCopier() = default;
  virtual void start_to_host(std::size_t chunk, int slot) = 0;
  virtual void wait_to_host(std::size_t chunk) = 0;
  virtual void start_to_device(std::size_t chunk, int slot) = 0;
  virtual void wait_to_device(std::size_t chunk) = 0;
};

// The chunks of `bytes` at `chunk_bytes` each (the last one shorter); at least one.
std::size_t chunk_count(std::size_t bytes, std::size_t chunk_bytes);

// Runs the pipeline over `chunks` chunks: chunk i uses slot i % staging_slots, and a slot is
// refilled only after the chunk before in it went back to the device. `communicate(chunk, slot)` runs the
// MPI operation on the chunk in its slot, in chunk order. Returns when every chunk is back.
void run_staged_pipeline(std::size_t chunks, ChunkCopier& copier,
                         const std::function<void(std::size_t chunk, int slot)>& communicate);

}  // namespace mlptrain
