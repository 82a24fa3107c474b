// The background writer against the bytes it was given: pieces with whole pages (written around
// the page cache) and partial ones, unaligned in the file or in memory, small, joined where they
// touch, on a disk and on tmpfs (which may refuse O_DIRECT); a file that cannot be opened is a
// problem naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "io/background_writer.hpp"

using namespace mlptrain;

namespace {

constexpr std::size_t page = 4096;

// A file of `bytes` zeros; returns its path.
std::string zero_file(const std::string& folder, std::size_t bytes) {
  const std::string path = folder + "/writer-test-" + std::to_string(getpid());
  std::ofstream(path, std::ios::binary).write(std::vector<char>(bytes).data(), static_cast<std::streamsize>(bytes));
  return path;
}

std::vector<char> contents(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void writes_what_it_was_given(const std::string& folder, bool background) {
  const std::size_t big = 80 * page;  // 320 KiB: whole pages this long go around the page cache
  const std::size_t file_bytes = 4 * big;
  const std::string path = zero_file(folder, file_bytes);
  std::unique_ptr<char, decltype(&std::free)> memory(static_cast<char*>(std::aligned_alloc(page, 2 * big)), std::free);
  for (std::size_t i = 0; i < 2 * big; ++i) memory.get()[i] = static_cast<char>(i * 7 + 3);
  char* const at = memory.get();
  const std::vector<FileWrite> writes = {
      {.file_offset = 0, .data = at, .bytes = big + 100},                         // whole pages and a tail
      {.file_offset = big + 100, .data = at + big + 100, .bytes = 50},            // joins the first
      {.file_offset = big + 2 * page + 10, .data = at + 10, .bytes = big},        // a head, pages, a tail
      {.file_offset = 2 * big + 3 * page, .data = at + 1, .bytes = big},          // unaligned in memory
      {.file_offset = 3 * big + page, .data = at + 5 * page, .bytes = 3 * page},  // small
      {.file_offset = 3 * big, .data = at, .bytes = 0}};                          // nothing
  EXPECT_EQ(coalesce_writes(writes).size(), 4u);
  std::vector<char> expected(file_bytes, 0);
  for (const FileWrite& write : writes)
    std::copy_n(static_cast<const char*>(write.data), write.bytes, expected.begin() + static_cast<long>(write.file_offset));
  BackgroundWriter writer;
  writer.start(path, coalesce_writes(writes), background);
  EXPECT_EQ(writer.wait(), std::nullopt);
  EXPECT_TRUE(writer.ended());
  EXPECT_LE(writer.started_ms(), writer.ended_ms());
  EXPECT_EQ(contents(path), expected);
  std::filesystem::remove(path);
}

}  // namespace

TEST(BackgroundWriter, WritesTheGivenBytesOnADisk) {
  writes_what_it_was_given(::testing::TempDir(), true);
  writes_what_it_was_given(::testing::TempDir(), false);
}

TEST(BackgroundWriter, WritesTheGivenBytesOnTmpfs) { writes_what_it_was_given("/dev/shm", true); }

TEST(BackgroundWriter, AFileThatCannotBeOpenedIsNamed) {
  BackgroundWriter writer;
  const char data[4] = {};
  writer.start("/nonexistent-folder/file.partial", {{.file_offset = 0, .data = data, .bytes = 4}}, true);
  const auto problem = writer.wait();
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("'/nonexistent-folder/file.partial'"), std::string::npos) << *problem;
}
