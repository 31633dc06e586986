#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

AtomicFile::AtomicFile(fs::path final_path) : final_(std::move(final_path)) {
  tmp_ = final_;
  tmp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    SF_FAIL(io, tmp_.string(), ": cannot create (", std::strerror(errno),
            "); check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  auto p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      SF_FAIL(io, final_.string(), ": write failed (", std::strerror(n < 0 ? errno : ENOSPC),
              "); the previous version of this file is untouched; free disk space and retry");
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFile::pwrite(const void* data, size_t bytes, size_t offset) {
  auto p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      SF_FAIL(io, final_.string(), ": write failed (", std::strerror(n < 0 ? errno : ENOSPC),
              "); the previous version of this file is untouched");
    p += n;
    bytes -= size_t(n);
    offset += size_t(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0)
    SF_FAIL(io, final_.string(), ": fsync failed (", std::strerror(errno), ")");
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), final_.c_str()) != 0)
    SF_FAIL(io, final_.string(), ": rename from temporary failed (", std::strerror(errno), ")");
  committed_ = true;
  fsync_dir(final_.has_parent_path() ? final_.parent_path() : fs::path("."));
}

void write_file_atomic(const fs::path& p, std::string_view contents) {
  AtomicFile f(p);
  f.write(contents);
  f.commit();
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  SF_REQUIRE(f.good(), p.string(), ": cannot open for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace sf
