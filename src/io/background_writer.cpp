// Background file writes (see background_writer.hpp).
#include "io/background_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/timer.hpp"

namespace mlptrain {

std::vector<FileWrite> coalesce_writes(std::vector<FileWrite> writes) {
  std::vector<FileWrite> joined;
  for (const FileWrite& write : writes) {
    if (write.bytes == 0) continue;
    if (!joined.empty()) {
      FileWrite& last = joined.back();
      if (last.file_offset + last.bytes == write.file_offset &&
          static_cast<const std::byte*>(last.data) + last.bytes == write.data) {
        last.bytes += write.bytes;
        continue;
      }
    }
    joined.push_back(write);
  }
  return joined;
}

void BackgroundWriter::start(const std::string& path, std::vector<FileWrite> writes, bool background,
                             std::function<void()> first) {
  wait();
  path_ = path;
  writes_ = std::move(writes);
  first_ = std::move(first);
  problem_.clear();
  ended_.store(false, std::memory_order_release);
  if (background) {
    thread_ = std::thread([this] { write(); });
  } else {
    write();
  }
}

std::optional<std::string> BackgroundWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (problem_.empty()) return std::nullopt;
  return problem_;
}

namespace {

constexpr std::size_t page = 4096;
// Around the cache each call waits for the disk: small pieces (a tensor-parallel rank's row of
// a column block) are far faster gathered by the page cache.
constexpr std::size_t direct_minimum_bytes = std::size_t{256} << 10;

bool page_aligned(std::uint64_t value) { return value % page == 0; }

// Writes `bytes` from `data` at `offset`, in calls of at most 1 GiB (a pwrite may write less than
// asked). Returns false with errno set when a call fails.
bool write_all(int descriptor, const std::byte* data, std::size_t bytes, std::uint64_t offset) {
  constexpr std::size_t most_per_call = std::size_t{1} << 30;
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t written = ::pwrite(descriptor, data + done, std::min(bytes - done, most_per_call),
                                     static_cast<off_t>(offset + done));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      if (written == 0) errno = EIO;
      return false;
    }
    done += static_cast<std::size_t>(written);
  }
  return true;
}

}  // namespace

void BackgroundWriter::write() {
  if (first_) first_();
  started_ms_ = now_ms();
  const auto fail = [&](const char* what) {
    problem_ = "checkpoint: " + std::string(what) + " '" + path_ + "' failed: " + std::strerror(errno);
  };
  const int descriptor = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  // Whole pages go around the page cache (O_DIRECT): no copy into it, no memory taken from
  // training, no dirty pages to flush. A file system that refuses it gets them through the cache.
  int direct = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  if (descriptor < 0) {
    fail("opening");
  } else {
    for (const FileWrite& piece : writes_) {
      // A page-aligned middle of enough pages goes around the cache; the partial pages at either
      // end (which a neighbouring slice of another rank may share) and small pieces through it.
      const auto* data = static_cast<const std::byte*>(piece.data);
      const std::size_t head = std::min<std::size_t>(piece.bytes, (page - piece.file_offset % page) % page);
      const std::size_t middle = (piece.bytes - head) / page * page;
      const bool around = direct >= 0 && middle >= direct_minimum_bytes &&
                          page_aligned(reinterpret_cast<std::uintptr_t>(data + head));
      bool written = true;
      if (around) {
        written = write_all(descriptor, data, head, piece.file_offset) &&
                  write_all(direct, data + head, middle, piece.file_offset + head);
        if (!written && errno == EINVAL) {  // an alignment this file system does not take
          ::close(direct);
          direct = -1;
          written = write_all(descriptor, data + head, middle, piece.file_offset + head);
        }
        written = written && write_all(descriptor, data + head + middle, piece.bytes - head - middle,
                                       piece.file_offset + head + middle);
      } else {
        written = write_all(descriptor, data, piece.bytes, piece.file_offset);
      }
      if (!written) {
        fail("writing");
        break;
      }
    }
    if (problem_.empty() && ::fsync(descriptor) != 0) fail("syncing");
    if (::close(descriptor) != 0 && problem_.empty()) fail("closing");
  }
  if (direct >= 0) ::close(direct);
  ended_ms_ = now_ms();
  ended_.store(true, std::memory_order_release);
}

}  // namespace mlptrain
