// Writes pieces of host memory at given offsets of one existing file, on a thread of its own or
// before returning, then makes them durable (fsync), so that training can go on while a
// checkpoint reaches the disk. A piece's whole pages (page-aligned in the file and in memory, 256
// KiB or more) go around the page cache (O_DIRECT): no copy into it and no dirty pages to flush,
// which on the machines measured was both faster and steadier; the rest goes through it. Each piece is read from memory that must stay unchanged
// until the writer has ended. Not thread-safe itself: one owner starts it, asks and waits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace mlptrain {

struct FileWrite {
  std::uint64_t file_offset = 0;  // bytes
  const void* data = nullptr;
  std::size_t bytes = 0;
};

// Joins neighbouring writes (contiguous both in the file and in memory) into one.
std::vector<FileWrite> coalesce_writes(std::vector<FileWrite> writes);

class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  ~BackgroundWriter() { wait(); }
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts writing `writes` into the file at `path` (which must exist), on a new thread when
  // `background`, else before returning; `first` runs on that thread before the writes (work on
  // the bytes about to be written, such as their checksums, that the caller need not wait for).
  // A previous write must have been waited for.
  void start(const std::string& path, std::vector<FileWrite> writes, bool background,
             std::function<void()> first = {});
  // Whether the writes started last have ended, well or not.
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  // Waits for the writes to end; returns what went wrong (naming the file), or nothing.
  std::optional<std::string> wait();
  // When the last writes ran, on the clock of core/timer.hpp (valid once they have ended).
  double started_ms() const { return started_ms_; }
  double ended_ms() const { return ended_ms_; }

 private:
  void write();

  std::string path_;
  std::vector<FileWrite> writes_;
  std::function<void()> first_;
  std::thread thread_;
  std::atomic<bool> ended_{true};
  std::string problem_;
  double started_ms_ = 0;
  double ended_ms_ = 0;
};

}  // namespace mlptrain
