// Crash-safe file output: write to "<name>.tmp.<pid>", fsync, rename over the final name,
// fsync the directory. A process killed at any moment leaves either the old file or the
// new one, never a torn one. Write errors (e.g. a full disk) throw Error(io) naming the file
// and remove the temporary.
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace sf {

class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path final_path);
  ~AtomicFile();  // discards the temporary unless commit() ran
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Writes `bytes` at absolute offset (for headers patched after the payload).
  void pwrite(const void* data, size_t bytes, size_t offset);
  void commit();  // fsync + rename + fsync(dir)
  const std::filesystem::path& temp_path() const { return tmp_; }

 private:
  std::filesystem::path final_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomic(const std::filesystem::path& p, std::string_view contents);
// fsync a directory (after renames inside it).
void fsync_dir(const std::filesystem::path& dir);
std::string read_file(const std::filesystem::path& p);

}  // namespace sf
