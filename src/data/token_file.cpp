#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sf {

namespace {
constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeader = 256 * sizeof(int32_t);
}  // namespace

TokenFile::TokenFile(const std::filesystem::path& p) : path_(p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  SF_REQUIRE(fd >= 0, p.string(), ": cannot open token file (", std::strerror(errno), ")");
  struct stat st {};
  ::fstat(fd, &st);
  map_bytes_ = size_t(st.st_size);
  if (map_bytes_ == 0) {
    ::close(fd);
    SF_FAIL(input, p.string(), ": token file is empty");
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  SF_REQUIRE(map_ != MAP_FAILED, p.string(), ": mmap failed (", std::strerror(errno), ")");
  auto base = static_cast<const char*>(map_);
  int32_t head[3] = {0, 0, 0};
  if (map_bytes_ >= kLlmcHeader) std::memcpy(head, base, sizeof(head));
  if (head[0] == kLlmcMagic) {
    SF_REQUIRE(head[1] == 1 || head[1] == 2, p.string(), ": llm.c header version ", head[1],
               " is unknown (expected 1 = uint16 tokens or 2 = uint32 tokens)");
    wide_ = head[1] == 2;
    n_ = head[2];
    size_t need = kLlmcHeader + size_t(n_) * (wide_ ? 4 : 2);
    SF_REQUIRE(n_ > 0 && need <= map_bytes_, p.string(), ": header says ", n_,
               " tokens but the file holds only ", (map_bytes_ - kLlmcHeader) / (wide_ ? 4 : 2),
               "; the file is truncated");
    if (wide_) u32_ = reinterpret_cast<const uint32_t*>(base + kLlmcHeader);
    else u16_ = reinterpret_cast<const uint16_t*>(base + kLlmcHeader);
  } else {
    SF_REQUIRE(map_bytes_ % 4 == 0, p.string(), ": size ", map_bytes_,
               " is not a multiple of 4; expected a raw uint32 token stream or an llm.c .bin");
    wide_ = true;
    n_ = int64_t(map_bytes_ / 4);
    u32_ = reinterpret_cast<const uint32_t*>(base);
  }
}

TokenFile::~TokenFile() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
}

uint32_t TokenFile::max_id() const {
  uint32_t m = 0;
  for (int64_t i = 0; i < n_; ++i) m = std::max(m, (*this)[i]);
  return m;
}

void write_token_file(const std::filesystem::path& p, const uint32_t* ids, int64_t n) {
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = 2;
  header[2] = int32_t(n);
  AtomicFile f(p);
  f.write(header, sizeof(header));
  f.write(ids, size_t(n) * 4);
  f.commit();
}

}  // namespace sf
