// POSIX shared-memory regions (contract in shared_memory.h).
#include "dist/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "core/bytes.h"
#include "core/error.h"

namespace sf::dist {

namespace {

void check_name(const std::string& name) {
  SF_CHECK(name.size() >= 2 && name.size() <= 255 && name[0] == '/' && name.find('/', 1) == std::string::npos,
           "shared region name \"", name, "\": one '/' first, none after, at most 255 characters");
}

std::string no_room(const std::string& name, size_t bytes, size_t free_bytes) {
  return cat("shared region ", name, " needs ", format_bytes(bytes), " but /dev/shm has ", format_bytes(free_bytes),
             " free: enlarge /dev/shm (docker run --shm-size, or mount -o remount,size=... /dev/shm), free RAM, "
             "or shrink the state (--optimizer-state int8)");
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) SF_FAIL(out_of_memory, "cannot map shared region ", name, " (", format_bytes(bytes), "): ",
                               std::strerror(errno));
  return p;
}

}  // namespace

SharedRegion SharedRegion::create(const std::string& name, size_t bytes) {
  check_name(name);
  SF_CHECK(bytes > 0, "shared region ", name, " of 0 bytes");
  // Asked first: posix_fallocate on a tmpfs too small would fill it before it fails.
  const size_t free_bytes = shm_free_bytes();
  if (bytes > free_bytes) SF_FAIL(out_of_memory, no_room(name, bytes, free_bytes));
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST)
    SF_FAIL(io, "shared region ", name, " already exists: another run uses this id, or a crashed run left it; "
            "remove /dev/shm", name, " if no slideformer run is using it");
  if (fd < 0) SF_FAIL(io, "cannot create shared region ", name, ": ", std::strerror(errno));
  SharedRegion r;
  r.name_ = name;
  r.owner_ = r.linked_ = true;  // from here the destructor removes the name on any failure
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    ::close(fd);
    if (err == ENOSPC) SF_FAIL(out_of_memory, no_room(name, bytes, shm_free_bytes()));
    SF_FAIL(io, "cannot size shared region ", name, " to ", format_bytes(bytes), ": ", std::strerror(err));
  }
  r.data_ = map(fd, bytes, name);
  r.size_ = bytes;
  ::close(fd);  // the mapping keeps the object
  return r;
}

SharedRegion SharedRegion::open(const std::string& name, size_t bytes) {
  check_name(name);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0 && errno == ENOENT)
    SF_FAIL(io, "shared region ", name, " does not exist: local rank 0 has not created it (yet), or this rank "
            "got another run id; ranks of one host must share one launch");
  if (fd < 0) SF_FAIL(io, "cannot open shared region ", name, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    const auto have = static_cast<size_t>(st.st_size);
    ::close(fd);
    SF_FAIL(io, "shared region ", name, " holds ", have, " bytes, this rank expects ", bytes,
            ": the ranks disagree on the model or the state format; start them with the same arguments");
  }
  SharedRegion r;
  r.name_ = name;
  r.data_ = map(fd, bytes, name);
  r.size_ = bytes;
  ::close(fd);
  return r;
}

SharedRegion::SharedRegion(SharedRegion&& o) noexcept
    : name_(std::move(o.name_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
      owner_(std::exchange(o.owner_, false)), linked_(std::exchange(o.linked_, false)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  std::swap(name_, o.name_);
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  std::swap(owner_, o.owner_);
  std::swap(linked_, o.linked_);
  return *this;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (owner_ && linked_) ::shm_unlink(name_.c_str());
}

void SharedRegion::unlink() {
  SF_CHECK(owner_, "shared region ", name_, ": only its creator unlinks it");
  if (linked_ && ::shm_unlink(name_.c_str()) != 0 && errno != ENOENT)
    SF_FAIL(io, "cannot remove shared region ", name_, ": ", std::strerror(errno));
  linked_ = false;
}

std::string shared_region_name(const std::string& run_id, const std::string& what) {
  return cat("/slideformer-", run_id, "-", what);
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t x = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

size_t shm_free_bytes() {
  struct statvfs s {};
  if (::statvfs("/dev/shm", &s) != 0) return 0;
  return size_t(s.f_bavail) * size_t(s.f_frsize);
}

}  // namespace sf::dist
