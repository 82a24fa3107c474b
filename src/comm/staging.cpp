// The host-staging chunk pipeline (see staging.hpp).
#include "comm/staging.hpp"

namespace mlptrain {

std::size_t chunk_count(std::size_t bytes, std::size_t chunk_bytes) {
  if (bytes == 0 || chunk_bytes == 0) return 1;
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

void run_staged_pipeline(std::size_t chunks, ChunkCopier& copier,
                         const std::function<void(std::size_t chunk, int slot)>& communicate) {
  constexpr std::size_t slots = staging_slots;
  const auto slot = [](std::size_t chunk) { return static_cast<int>(chunk % slots); };
  copier.start_to_host(0, 0);
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
    if (chunk + 1 < chunks) {
      // The next chunk's slot held chunk + 1 - slots: it must be back on the device first.
      if (chunk + 1 >= slots) copier.wait_to_device(chunk + 1 - slots);
      copier.start_to_host(chunk + 1, slot(chunk + 1));
    }
    copier.wait_to_host(chunk);
    communicate(chunk, slot(chunk));  // while chunk + 1 comes up and chunk - 1 goes down
    copier.start_to_device(chunk, slot(chunk));
  }
  // What the loop did not wait for: the last `slots` chunks (all, when there are fewer).
  for (std::size_t chunk = chunks >= slots ? chunks - slots : 0; chunk < chunks; ++chunk)
    copier.wait_to_device(chunk);
}

}  // namespace mlptrain
