// ParamStore (see param_store.h): allocation per unit from its UnitStateLayout, the fp32
// accessors and master conversions, and the moments' file (open_moments_file, map_moments,
// prefetch_moments, moments_done: the disk part, kept apart for the O_DIRECT tier to replace).
#include "optim/param_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/bytes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/anonymous_file.h"

namespace sf {

HostArray::HostArray(size_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p_ == MAP_FAILED) {
    p_ = nullptr;
    SF_FAIL(out_of_memory, "cannot reserve ", bytes >> 20, " MiB of host memory for ", what,
            " (", std::strerror(errno), "); lower --host-memory use or add RAM");
  }
  ::madvise(p_, bytes, MADV_HUGEPAGE);  // fewer TLB misses in the optimizer sweep
}

HostArray::HostArray(int fd, size_t offset, size_t bytes, const char* what) : n_(bytes) {
  if (bytes == 0) return;
  p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
  if (p_ == MAP_FAILED) {
    p_ = nullptr;
    SF_FAIL(io, "cannot map ", bytes >> 20, " MiB of the optimizer's file for ", what, " (",
            std::strerror(errno), ")");
  }
}

HostArray::~HostArray() {
  if (p_) ::munmap(p_, n_);
}

HostArray& HostArray::operator=(HostArray&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, n_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

namespace {

constexpr size_t kPage = 4096;
size_t page_round(size_t n) { return (n + kPage - 1) / kPage * kPage; }

// An anonymous file of `bytes` in dir with its blocks reserved, so a full disk shows now,
// not as SIGBUS in the middle of an optimizer sweep.
int open_moments_file(const std::string& dir, size_t bytes) {
  const int fd = open_anonymous_file(dir);
  SF_REQUIRE(fd >= 0, "--optimizer-dir ", dir, ": cannot create the optimizer's file there (",
             std::strerror(errno), "); give a writable directory on a fast local disk");
  int rc = ::posix_fallocate(fd, 0, off_t(bytes));
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd, off_t(bytes)) == 0 ? 0 : errno;
  if (rc != 0) {
    ::close(fd);
    SF_REQUIRE(false, "--optimizer-dir ", dir, ": cannot reserve ", format_bytes(bytes),
               " for the AdamW moments (", std::strerror(rc), "; ", format_bytes(disk_free_bytes(dir)),
               " free there); free space or choose another directory");
  }
  return fd;
}

}  // namespace

size_t moments_file_bytes(const std::vector<StateUnit>& units, StateFormat format) {
  size_t n = 0;
  for (auto& unit : units) n += 2 * page_round(unit_state_layout(unit, format).moment_bytes);
  return n;
}

size_t disk_free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return size_t(s.f_bavail) * size_t(s.f_frsize);
}

namespace {

// Zero-filled on first touch anyway; faulted in now, spread over the threads: left to the
// first AdamW sweep, 64 GB of faults at 8B cost that step ~9 s.
void fault_in(HostArray& a) {
  char* p = a.as<char>();
  host_pool().parallel_for(int64_t(a.bytes()), [&](int64_t b, int64_t e) {
    std::memset(p + b, 0, size_t(e - b));
  }, int64_t(1) << 21);
}

const char* master_what(StateFormat f) {
  return f.master == MasterFormat::bf16 ? "bf16 master weights" : "fp32 master weights";
}

}  // namespace

void ParamStore::allocate_in_ram(UnitState& s) {
  const size_t bytes = s.layout.moment_bytes;
  s.m = HostArray(bytes, "AdamW first moments");
  s.v = HostArray(bytes, "AdamW second moments");
  fault_in(s.m);
  fault_in(s.v);
}

// m and v of one unit in the moments' file at `file_offset` (advanced past them), zero
// already (a new file); read and written by the optimizer's sweeps only.
void ParamStore::map_moments(UnitState& s, size_t& file_offset) {
  const size_t bytes = s.layout.moment_bytes;
  s.file_offset = file_offset;
  s.m = HostArray(fd_, file_offset, bytes, "AdamW first moments");
  s.v = HostArray(fd_, file_offset + page_round(bytes), bytes, "AdamW second moments");
  file_offset += 2 * page_round(bytes);
}

ParamStore::ParamStore(const std::vector<StateUnit>& units, StateFormat format,
                       const std::string& moments_dir, bool streamed)
    : format_(format) {
  if (!moments_dir.empty()) fd_ = open_moments_file(moments_dir, moments_file_bytes(units, format));
  streamed_ = fd_ >= 0 && streamed;
  size_t file_off = 0;
  for (auto& unit : units) {
    check_param_ranges(unit.ranges, unit.numel, "parameter store");
    UnitState s;
    s.numel = unit.numel;
    s.layout = unit_state_layout(unit, format);
    s.ranges = unit.ranges;
    s.master = HostArray(s.layout.master_bytes, master_what(format));
    if (fd_ >= 0) map_moments(s, file_off);
    else allocate_in_ram(s);
    const size_t scale_bytes = size_t(s.layout.scale_count) * sizeof(float);
    s.m_scale = HostArray(scale_bytes, "int8 AdamW first-moment scales");
    s.v_scale = HostArray(scale_bytes, "int8 AdamW second-moment scales");
    units_.push_back(std::move(s));
  }
}

ParamStore::~ParamStore() {
  units_.clear();  // unmapped before the file goes
  if (fd_ >= 0) ::close(fd_);
}

UnitStateView ParamStore::state(int u) const {
  const UnitState& s = unit(u);
  UnitStateView v;
  v.format = format_;
  v.layout = &s.layout;
  v.master = s.master.data();
  v.m = s.m.data();
  v.v = s.v.data();
  v.m_scale = s.m_scale.as<float>();
  v.v_scale = s.v_scale.as<float>();
  v.rounding_seed = rounding_seed;
  v.unit = int32_t(u);
  return v;
}

float* ParamStore::master(int u) const {
  SF_CHECK(format_.master == MasterFormat::f32, "ParamStore::master(", u,
           "): the master weights are ", master_format_name(format_.master),
           ", not fp32; use state(u), read_master_f32 or write_master_f32");
  return unit(u).master.as<float>();
}

uint16_t* ParamStore::master_bf16(int u) const {
  SF_CHECK(format_.master == MasterFormat::bf16, "ParamStore::master_bf16(", u,
           "): the master weights are ", master_format_name(format_.master), ", not bf16");
  return unit(u).master.as<uint16_t>();
}

float* ParamStore::m(int u) const {
  SF_CHECK(format_.moments == MomentFormat::f32, "ParamStore::m(", u, "): the AdamW moments are ",
           moment_format_name(format_.moments), ", not fp32; use state(u)");
  return unit(u).m.as<float>();
}

float* ParamStore::v(int u) const {
  SF_CHECK(format_.moments == MomentFormat::f32, "ParamStore::v(", u, "): the AdamW moments are ",
           moment_format_name(format_.moments), ", not fp32; use state(u)");
  return unit(u).v.as<float>();
}

void ParamStore::read_master_f32(int u, float* out) const {
  const UnitState& s = unit(u);
  if (format_.master == MasterFormat::f32) {
    std::memcpy(out, s.master.data(), size_t(s.numel) * sizeof(float));
    return;
  }
  const uint16_t* in = s.master.as<uint16_t>();
  host_pool().parallel_for(s.numel, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = bf16_to_f32(in[i]);
  }, int64_t(1) << 16);
}

void ParamStore::write_master_f32(int u, const float* in) {
  UnitState& s = units_[size_t(u)];
  if (format_.master == MasterFormat::f32) {
    std::memcpy(s.master.data(), in, size_t(s.numel) * sizeof(float));
    return;
  }
  uint16_t* out = s.master.as<uint16_t>();
  host_pool().parallel_for(s.numel, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(in[i]);
  }, int64_t(1) << 16);
}

void ParamStore::moments_done(int u) {
  if (!streamed_) return;
  std::lock_guard<std::mutex> lk(done_mu_);
  auto range = [&](int k) {
    const UnitState& s = units_[size_t(k)];
    return std::pair<off_t, off_t>(off_t(s.file_offset), off_t(2 * page_round(s.m.bytes())));
  };
  const auto [off, len] = range(u);
  ::sync_file_range(fd_, off, len, SYNC_FILE_RANGE_WRITE);
  if (last_done_ >= 0 && last_done_ != u) {
    // Written by now (mostly: it started one unit ago); wait, then drop the clean pages.
    const UnitState& p = units_[size_t(last_done_)];
    const auto [poff, plen] = range(last_done_);
    ::sync_file_range(fd_, poff, plen,
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    for (const HostArray* a : {&p.m, &p.v})
      if (a->data()) ::madvise(a->data(), a->bytes(), MADV_DONTNEED);  // unmap: the file has them
    ::posix_fadvise(fd_, poff, plen, POSIX_FADV_DONTNEED);
  }
  last_done_ = u;
}

void ParamStore::prefetch_moments(int u) const {
  if (fd_ < 0) return;
  const UnitState& s = units_[size_t(u)];
  for (const HostArray* a : {&s.m, &s.v})
    if (a->data()) ::madvise(a->data(), a->bytes(), MADV_WILLNEED);
}

std::vector<float*> ParamStore::master_ptrs() const {
  std::vector<float*> p;
  for (int u = 0; u < n_units(); ++u) p.push_back(master(u));
  return p;
}

size_t ParamStore::host_bytes() const {
  size_t n = 0;
  for (auto& u : units_) {
    n += u.master.bytes() + u.m_scale.bytes() + u.v_scale.bytes();
    if (fd_ < 0) n += u.m.bytes() + u.v.bytes();
  }
  return n;
}

}  // namespace sf
