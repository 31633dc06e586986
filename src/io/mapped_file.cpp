#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace sf {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const std::string src = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) SF_FAIL(input, src, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SF_FAIL(input, src, ": not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      size_ = 0;
      SF_FAIL(io, src, ": mmap of ", st.st_size, " bytes failed (", std::strerror(err), ")");
    }
  } else {
    ::close(fd);
  }
}

const uint8_t* MappedFile::data() const {
  static const uint8_t empty[1] = {0};
  return map_ ? static_cast<const uint8_t*>(map_) : empty;
}

void MappedFile::release() {
  if (map_) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace sf
