// ParamStore (see param_store.h): allocation per unit from its UnitStateLayout, the fp32
// accessors and master conversions, and the units on disk (the tier: map_from_disk,
// arrays_of, prefetch / acquire / done, kept together at the end).
#include "optim/param_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/bytes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

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

HostArray HostArray::view(void* p, size_t bytes) {
  HostArray a;
  a.p_ = bytes ? p : nullptr;
  a.n_ = bytes;
  a.owned_ = false;
  return a;
}

HostArray::~HostArray() {
  if (p_ && owned_) ::munmap(p_, n_);
}

HostArray& HostArray::operator=(HostArray&& o) noexcept {
  if (this != &o) {
    if (p_ && owned_) ::munmap(p_, n_);
    p_ = o.p_;
    n_ = o.n_;
    owned_ = o.owned_;
    o.p_ = nullptr;
    o.n_ = 0;
    o.owned_ = true;
  }
  return *this;
}

namespace {

// A unit's parts in the tier's file: m, v, then the master (each 4 KiB-aligned there and in a
// slot); empty parts for what stays in RAM.
enum DiskPart { kPartM = 0, kPartV = 1, kPartMaster = 2 };
std::vector<std::vector<size_t>> disk_parts(const std::vector<StateUnit>& units, StateFormat format,
                                            DiskUnits disk) {
  const std::vector<char> on_disk = disk_unit_choice(units, disk.count);
  const std::vector<char> master = master_disk_choice(units, disk);
  std::vector<std::vector<size_t>> parts;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitStateLayout l = unit_state_layout(units[u], format);
    const size_t b = on_disk[u] ? l.moment_bytes : 0;
    parts.push_back({b, b, master[u] ? l.master_bytes : 0});
  }
  return parts;
}

}  // namespace

std::vector<char> disk_unit_choice(const std::vector<StateUnit>& units, int disk_units) {
  const int n = int(units.size());
  if (disk_units < 0 || disk_units >= n) return std::vector<char>(size_t(n), 1);
  std::vector<char> on(size_t(n), 0);
  const int layers = std::max(0, n - 2);  // units 1 .. n-2
  const int k = std::min(disk_units, layers);
  // Layer i (0-based) goes when the running share floor((i + 1) k / layers) steps up: k of
  // them, one every layers / k.
  for (int i = 0; i < layers; ++i)
    if (int64_t(i + 1) * k / layers > int64_t(i) * k / layers) on[size_t(i + 1)] = 1;
  if (disk_units > layers) on[size_t(n - 1)] = 1;
  if (disk_units > layers + 1) on[0] = 1;
  return on;
}

std::vector<char> master_disk_choice(const std::vector<StateUnit>& units, DiskUnits disk) {
  std::vector<char> on(units.size(), 0);
  if (!disk.masters) return on;
  on = disk_unit_choice(units, disk.count);
  if (!on.empty()) on[0] = 0;
  return on;
}

size_t disk_file_bytes(const std::vector<StateUnit>& units, StateFormat format, DiskUnits disk) {
  return StateDisk::file_bytes_for(disk_parts(units, format, disk));
}

size_t disk_slot_bytes(const std::vector<StateUnit>& units, StateFormat format, DiskUnits disk) {
  size_t largest = 0;
  for (auto& parts : disk_parts(units, format, disk)) largest = std::max(largest, StateDisk::file_bytes_for({parts}));
  return size_t(ParamStore::kDiskSlots) * largest;
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

// m and v (and the master, on disk) of unit u mapped from the tier's file (shared: for the
// readers outside the sweep).
void ParamStore::map_from_disk(UnitState& s, int u) {
  const size_t bytes = s.layout.moment_bytes;
  s.m = HostArray(disk_->fd(), disk_->part_file_offset(u, kPartM), bytes, "AdamW first moments");
  s.v = HostArray(disk_->fd(), disk_->part_file_offset(u, kPartV), bytes, "AdamW second moments");
  if (master_on_disk(u))
    s.master = HostArray(disk_->fd(), disk_->part_file_offset(u, kPartMaster), s.layout.master_bytes,
                         master_what(format_));
}

namespace {

constexpr size_t kExternalAlign = 4096;
size_t align_up(size_t x) { return (x + kExternalAlign - 1) / kExternalAlign * kExternalAlign; }

// The arrays of one unit in external memory, in this order (sizes from its layout).
std::vector<size_t> external_parts(const UnitStateLayout& l) {
  const size_t scales = size_t(l.scale_count) * sizeof(float);
  return {l.master_bytes, l.moment_bytes, l.moment_bytes, scales, scales};
}

}  // namespace

size_t ParamStore::external_bytes(const std::vector<StateUnit>& units, StateFormat format) {
  size_t total = 0;
  for (const StateUnit& u : units)
    for (size_t b : external_parts(unit_state_layout(u, format))) total += align_up(b);
  return total;
}

ParamStore::ParamStore(const std::vector<StateUnit>& units, StateFormat format,
                       const std::string& moments_dir, bool streamed, DiskUnits disk,
                       ExternalStateMemory external)
    : format_(format) {
  SF_CHECK(!disk.masters || (format.master == MasterFormat::bf16 && !moments_dir.empty()),
           "parameter store: only a bf16 master goes to the disk tier, and only with a moments directory");
  if (external.base) {
    SF_REQUIRE(moments_dir.empty(), "--optimizer-dir: the AdamW moments cannot go to a disk when the "
               "training state is shared by several ranks; leave --optimizer-dir out or train with --gpus 1");
    SF_CHECK(reinterpret_cast<uintptr_t>(external.base) % kExternalAlign == 0,
             "parameter store: external memory must be 4096-byte aligned");
    SF_CHECK(external.bytes >= external_bytes(units, format), "parameter store: external memory of ",
             external.bytes, " bytes, the state needs ", external_bytes(units, format));
    char* at = static_cast<char*>(external.base);
    auto carve = [&](size_t bytes) {
      HostArray a = HostArray::view(at, bytes);
      at += align_up(bytes);
      return a;
    };
    for (const StateUnit& unit : units) {
      check_param_ranges(unit.ranges, unit.numel, "parameter store");
      UnitState s;
      s.numel = unit.numel;
      s.layout = unit_state_layout(unit, format);
      s.ranges = unit.ranges;
      const std::vector<size_t> parts = external_parts(s.layout);
      s.master = carve(parts[0]);
      s.m = carve(parts[1]);
      s.v = carve(parts[2]);
      s.m_scale = carve(parts[3]);
      s.v_scale = carve(parts[4]);
      units_.push_back(std::move(s));
    }
    return;
  }
  if (!moments_dir.empty()) {
    DirectFileOptions o;
    o.direct = streamed ? DirectIo::when_supported : DirectIo::buffered;  // cached: the page cache holds them
    on_disk_ = disk_unit_choice(units, disk.count);
    master_on_disk_ = master_disk_choice(units, disk);
    disk_ = std::make_unique<StateDisk>(moments_dir, disk_parts(units, format, disk), kDiskSlots, o);
    held_.assign(units.size(), UnitBytes{});
    mapped_.assign(units.size(), 0);
  }
  streamed_ = disk_ && streamed;
  for (size_t u = 0; u < units.size(); ++u) {
    const StateUnit& unit = units[u];
    check_param_ranges(unit.ranges, unit.numel, "parameter store");
    UnitState s;
    s.numel = unit.numel;
    s.layout = unit_state_layout(unit, format);
    s.ranges = unit.ranges;
    if (!master_on_disk(int(u))) s.master = HostArray(s.layout.master_bytes, master_what(format));
    if (moments_on_disk(int(u))) map_from_disk(s, int(u));
    else allocate_in_ram(s);
    const size_t scale_bytes = size_t(s.layout.scale_count) * sizeof(float);
    s.m_scale = HostArray(scale_bytes, "int8 AdamW first-moment scales");
    s.v_scale = HostArray(scale_bytes, "int8 AdamW second-moment scales");
    units_.push_back(std::move(s));
  }
}

ParamStore::~ParamStore() {
  units_.clear();  // unmapped before the file goes
  disk_.reset();
}

UnitStateView ParamStore::state(int u) const {
  const UnitState& s = unit(u);
  UnitStateView v;
  v.format = format_;
  v.layout = &s.layout;
  const Arrays a = arrays_of(u);
  v.master = a.master;
  v.m = a.m;
  v.v = a.v;
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
  return static_cast<uint16_t*>(arrays_of(u).master);
}

float* ParamStore::m(int u) const {
  SF_CHECK(format_.moments == MomentFormat::f32, "ParamStore::m(", u, "): the AdamW moments are ",
           moment_format_name(format_.moments), ", not fp32; use state(u)");
  return static_cast<float*>(arrays_of(u).m);
}

float* ParamStore::v(int u) const {
  SF_CHECK(format_.moments == MomentFormat::f32, "ParamStore::v(", u, "): the AdamW moments are ",
           moment_format_name(format_.moments), ", not fp32; use state(u)");
  return static_cast<float*>(arrays_of(u).v);
}

void ParamStore::read_master_f32(int u, float* out) const {
  const UnitState& s = unit(u);
  if (format_.master == MasterFormat::f32) {
    std::memcpy(out, s.master.data(), size_t(s.numel) * sizeof(float));
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(arrays_of(u).master);
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
  uint16_t* out = static_cast<uint16_t*>(arrays_of(u).master);
  host_pool().parallel_for(s.numel, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(in[i]);
  }, int64_t(1) << 16);
  if (master_on_disk(u)) settle_mapping(u);  // a model's init or load: one unit at a time in RAM
}

std::vector<float*> ParamStore::master_ptrs() const {
  std::vector<float*> p;
  for (int u = 0; u < n_units(); ++u) p.push_back(master(u));
  return p;
}

size_t ParamStore::host_bytes() const {
  size_t n = 0;
  for (int u = 0; u < n_units(); ++u) {
    const UnitState& s = unit(u);
    n += s.m_scale.bytes() + s.v_scale.bytes();
    if (!master_on_disk(u)) n += s.master.bytes();
    if (!moments_on_disk(u)) n += s.m.bytes() + s.v.bytes();
  }
  return n;
}

// ---- units on disk ----------------------------------------------------------------------

ParamStore::Arrays ParamStore::arrays_of(int u) const {
  const UnitState& s = unit(u);
  const Arrays ram{s.m.data(), s.v.data(), s.master.data()};
  if (!moments_on_disk(u)) return ram;
  const bool master = master_on_disk(u);
  std::lock_guard<std::mutex> lk(disk_mu_);
  const UnitBytes& h = held_[size_t(u)];
  if (h.n_parts > 0) return {h.part[kPartM], h.part[kPartV], master ? h.part[kPartMaster] : ram.master};
  if (!mapped_[size_t(u)]) {
    disk_->evict(u);  // the file alone has the unit now: the mapping sees its bytes
    mapped_[size_t(u)] = 1;
  }
  return ram;
}

std::vector<const HostArray*> ParamStore::mapped_arrays(int u) const {
  const UnitState& s = unit(u);
  if (master_on_disk(u)) return {&s.m, &s.v, &s.master};
  return {&s.m, &s.v};
}

// Out of this process (the file has them); streamed, out of the page cache too (cached, the
// tier's buffered reads find them there).
void ParamStore::drop_mapped_pages(int u) const {
  for (const HostArray* a : mapped_arrays(u))
    if (a->data()) ::madvise(a->data(), a->bytes(), MADV_DONTNEED);
  if (!streamed_) return;
  const size_t off = disk_->part_file_offset(u, 0), len = disk_->extent_bytes(u);
  ::posix_fadvise(disk_->fd(), off_t(off), off_t(len), POSIX_FADV_DONTNEED);
}

// Before the tier reads unit u again: what was written through the mapping goes to the file,
// and the mapping's pages go (they would be stale once the slot's copy is written back).
void ParamStore::retire_mapping_locked(int u) const {
  if (!mapped_[size_t(u)]) return;
  for (const HostArray* a : mapped_arrays(u))
    if (a->data() && ::msync(a->data(), a->bytes(), MS_SYNC) != 0)
      SF_FAIL(io, "--optimizer-dir ", disk_->dir(), ": writing unit ", u, "'s optimizer state failed (",
              std::strerror(errno), "); free space on ", disk_->dir(), " or choose another --optimizer-dir");
  drop_mapped_pages(u);
  mapped_[size_t(u)] = 0;
}

void ParamStore::settle_mapping(int u) const {
  if (!moments_on_disk(u)) return;
  std::lock_guard<std::mutex> lk(disk_mu_);
  retire_mapping_locked(u);
}

void ParamStore::prefetch_disk_unit(int u) const {
  if (!moments_on_disk(u)) return;
  {
    std::lock_guard<std::mutex> lk(disk_mu_);
    if (held_[size_t(u)].n_parts > 0) return;
    retire_mapping_locked(u);
  }
  disk_->prefetch(u);
}

void ParamStore::acquire_disk_unit(int u) const {
  if (!moments_on_disk(u)) return;
  {
    std::lock_guard<std::mutex> lk(disk_mu_);
    if (held_[size_t(u)].n_parts > 0) return;
    retire_mapping_locked(u);
  }
  const UnitBytes b = disk_->acquire(u);  // unlocked: the other units' prefetches go on meanwhile
  std::lock_guard<std::mutex> lk(disk_mu_);
  held_[size_t(u)] = b;
}

void ParamStore::disk_unit_done(int u) {
  if (!moments_on_disk(u)) return;
  std::unique_lock<std::mutex> lk(disk_mu_);
  if (held_[size_t(u)].n_parts > 0) {
    held_[size_t(u)] = UnitBytes{};
    lk.unlock();
    disk_->release(u);
    return;
  }
  if (!streamed_ || !mapped_[size_t(u)]) return;
  // Through the mapping: stream it out as the sweep goes (left to the kernel's reclaim, dirty
  // pages went out 4 KiB at a time: ENGINE.md, moments on disk).
  const size_t off = disk_->part_file_offset(u, 0), len = disk_->extent_bytes(u);
  ::sync_file_range(disk_->fd(), off_t(off), off_t(len), SYNC_FILE_RANGE_WRITE);
  if (last_done_ >= 0 && last_done_ != u && mapped_[size_t(last_done_)]) {
    const size_t poff = disk_->part_file_offset(last_done_, 0), plen = disk_->extent_bytes(last_done_);
    ::sync_file_range(disk_->fd(), off_t(poff), off_t(plen),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    drop_mapped_pages(last_done_);
  }
  last_done_ = u;
}

void ParamStore::flush_disk() const {
  if (disk_) disk_->flush();
}

}  // namespace sf
