#include "optim/state_disk.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/bytes.h"
#include "core/error.h"

namespace sf {

namespace {

size_t align_up(size_t n) { return (n + DirectFile::kAlign - 1) / DirectFile::kAlign * DirectFile::kAlign; }

// A unit's extent: its parts one after the other, each aligned; at least one block so that
// every unit moves through the file (a unit of empty parts still has its slot round trip).
size_t extent_of(const std::vector<size_t>& parts) {
  size_t n = 0;
  for (size_t b : parts) n += align_up(b);
  return std::max(n, DirectFile::kAlign);
}

}  // namespace

// The slots' RAM: one anonymous mapping, faulted in at construction (not in the first sweep).
struct StateDisk::Memory {
  void* p = nullptr;
  size_t n = 0;
  explicit Memory(size_t bytes) : n(bytes) {
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p = nullptr;
      SF_FAIL(out_of_memory, "disk tier: cannot reserve ", format_bytes(n), " of host memory for its slots (",
              std::strerror(errno), "); add RAM or lower the model's largest unit");
    }
    ::madvise(p, n, MADV_HUGEPAGE);
    std::memset(p, 0, n);
  }
  ~Memory() {
    if (p) ::munmap(p, n);
  }
};

size_t StateDisk::file_bytes_for(const std::vector<std::vector<size_t>>& unit_parts) {
  size_t n = 0;
  for (auto& parts : unit_parts) n += extent_of(parts);
  return n;
}

StateDisk::StateDisk(const std::string& dir, const std::vector<std::vector<size_t>>& unit_parts, int n_slots,
                     DirectFileOptions opt) {
  SF_REQUIRE(n_slots >= 1, "disk tier: ", n_slots, " slots; it needs at least 1 (2 overlap reads with writes)");
  size_t off = 0;
  for (size_t u = 0; u < unit_parts.size(); ++u) {
    const auto& parts = unit_parts[u];
    SF_CHECK(!parts.empty() && parts.size() <= size_t(UnitBytes::kMaxParts), "disk tier: unit ", u, " has ",
             parts.size(), " parts (1..", UnitBytes::kMaxParts, ")");
    Unit un;
    un.offset = off;
    un.extent = extent_of(parts);
    size_t p = 0;
    for (size_t b : parts) {
      un.part_offset.push_back(p);
      un.part_bytes.push_back(b);
      p += align_up(b);
    }
    off += un.extent;
    slot_bytes_ = std::max(slot_bytes_, un.extent);
    units_.push_back(std::move(un));
  }
  file_ = std::make_unique<DirectFile>(dir, off, std::move(opt));  // first: a full disk fails before the RAM
  memory_ = std::make_unique<Memory>(size_t(n_slots) * slot_bytes_);
  slots_.resize(size_t(n_slots));
  for (int s = 0; s < n_slots; ++s) slots_[size_t(s)].base = static_cast<std::byte*>(memory_->p) + size_t(s) * slot_bytes_;
}

StateDisk::~StateDisk() { file_.reset(); }

void StateDisk::check_unit(int u, const char* what) const {
  SF_CHECK(u >= 0 && u < n_units(), "StateDisk::", what, ": unit ", u, " of ", n_units());
}

void StateDisk::throw_if_failed_locked() const {
  if (!error_.empty()) SF_FAIL(io, error_);
}

// An empty slot, else the least recently used clean one.
int StateDisk::pick_slot_locked() const {
  int best = -1;
  for (int s = 0; s < n_slots(); ++s) {
    const Slot& x = slots_[size_t(s)];
    if (x.state == SlotState::empty) return s;
    if (x.state == SlotState::clean && (best < 0 || x.last_use < slots_[size_t(best)].last_use)) best = s;
  }
  return best;
}

// acquire(u) waits for a slot while another holds a copy prefetched and not acquired (a
// caller prefetched a unit it then did not need): u takes that slot instead of waiting for
// ever; the other unit is read again if it is acquired later. Returns whether it did.
bool StateDisk::steal_slot_locked(int u) {
  int best = -1;
  for (int s = 0; s < n_slots(); ++s) {
    const Slot& x = slots_[size_t(s)];
    if (x.state == SlotState::ready && x.matches_file && units_[size_t(x.unit)].waiting == 0 &&
        (best < 0 || x.last_use < slots_[size_t(best)].last_use))
      best = s;
  }
  if (best < 0) return false;
  Slot& x = slots_[size_t(best)];
  units_[size_t(x.unit)].slot = -1;
  x.state = SlotState::empty;
  x.unit = -1;
  pending_.erase(std::find(pending_.begin(), pending_.end(), u));
  pending_.push_front(u);
  assign_pending_locked();  // u first: it takes the emptied slot
  return true;
}

void StateDisk::start_read_locked(int s, int u) {
  Slot& x = slots_[size_t(s)];
  x.state = SlotState::reading;
  const Unit& un = units_[size_t(u)];
  file_->submit(IoOp::read, un.offset, x.base, un.extent, [this, s](const std::string& e) { on_read(s, e); });
}

// Gives free (or least recently used clean) slots to the units waiting, in prefetch order.
void StateDisk::assign_pending_locked() {
  while (error_.empty() && !pending_.empty()) {
    const int s = pick_slot_locked();
    if (s < 0) return;
    const int u = pending_.front();
    pending_.pop_front();
    Slot& x = slots_[size_t(s)];
    if (x.unit >= 0) units_[size_t(x.unit)].slot = -1;  // its clean copy goes
    Unit& un = units_[size_t(u)];
    un.pending = false;
    un.slot = s;
    x.unit = u;
    x.wanted = false;
    x.matches_file = false;
    x.last_use = ++clock_;
    if (un.pending_fill == SlotFill::overwrite) x.state = SlotState::ready;
    else start_read_locked(s, u);
  }
}

void StateDisk::queue_locked(int u, SlotFill fill) {
  Unit& un = units_[size_t(u)];
  if (un.slot >= 0) {  // in a slot already: a clean copy is ready, a write-back will be
    Slot& x = slots_[size_t(un.slot)];
    if (x.state == SlotState::clean) x.state = SlotState::ready;
    if (x.state == SlotState::writing) x.wanted = true;
    return;
  }
  if (un.pending) {
    if (fill == SlotFill::overwrite) un.pending_fill = fill;
    return;
  }
  un.pending = true;
  un.pending_fill = fill;
  pending_.push_back(u);
  assign_pending_locked();
}

void StateDisk::prefetch(int u) {
  check_unit(u, "prefetch");
  std::lock_guard<std::mutex> lk(mu_);
  throw_if_failed_locked();
  queue_locked(u, SlotFill::read);
}

UnitBytes StateDisk::acquire(int u, SlotFill fill) {
  check_unit(u, "acquire");
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  Unit& un = units_[size_t(u)];
  SF_CHECK(un.slot < 0 || slots_[size_t(un.slot)].state != SlotState::acquired, "StateDisk: unit ", u,
           " acquired twice");
  queue_locked(u, fill);
  bool stuck = false;  // waiting for a slot that only this caller's releases can free
  ++un.waiting;
  for (;;) {
    if (un.slot < 0 && !un.pending && error_.empty()) queue_locked(u, fill);  // its copy was dropped
    if (!error_.empty() || (un.slot >= 0 && slots_[size_t(un.slot)].state == SlotState::ready)) break;
    if (un.pending && steal_slot_locked(u)) continue;
    stuck = un.pending && std::all_of(slots_.begin(), slots_.end(),
                                      [](const Slot& x) { return x.state == SlotState::acquired; });
    if (stuck) break;
    cv_.wait(lk);
  }
  --un.waiting;
  throw_if_failed_locked();
  SF_CHECK(!stuck, "StateDisk: unit ", u, " waits for a slot but all ", n_slots(),
           " are acquired; release one first");
  Slot& x = slots_[size_t(un.slot)];
  x.state = SlotState::acquired;
  x.last_use = ++clock_;
  UnitBytes b;
  b.n_parts = int(un.part_bytes.size());
  for (int i = 0; i < b.n_parts; ++i) {
    b.part[size_t(i)] = x.base + un.part_offset[size_t(i)];
    b.bytes[size_t(i)] = un.part_bytes[size_t(i)];
  }
  return b;
}

void StateDisk::release(int u, SlotRelease how) {
  check_unit(u, "release");
  std::lock_guard<std::mutex> lk(mu_);
  throw_if_failed_locked();
  Unit& un = units_[size_t(u)];
  SF_CHECK(un.slot >= 0 && slots_[size_t(un.slot)].state == SlotState::acquired, "StateDisk: unit ", u,
           " released but not acquired");
  const int s = un.slot;
  Slot& x = slots_[size_t(s)];
  if (how == SlotRelease::unchanged) {
    if (x.matches_file) {
      x.state = SlotState::clean;
    } else {  // filled for overwrite and not kept: nothing of it is the file's
      x.state = SlotState::empty;
      x.unit = -1;
      un.slot = -1;
    }
    assign_pending_locked();
    cv_.notify_all();
    return;
  }
  x.state = SlotState::writing;
  file_->submit(IoOp::write, un.offset, x.base, un.extent, [this, s](const std::string& e) { on_written(s, e); });
}

void StateDisk::on_read(int s, const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Slot& x = slots_[size_t(s)];
    if (error.empty()) {
      x.state = SlotState::ready;
      x.matches_file = true;
    } else {
      if (error_.empty()) error_ = error;
      units_[size_t(x.unit)].slot = -1;
      x = Slot{SlotState::empty, -1, false, false, 0, x.base};
    }
  }
  cv_.notify_all();
}

void StateDisk::on_written(int s, const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Slot& x = slots_[size_t(s)];
    if (error.empty()) {
      x.state = x.wanted ? SlotState::ready : SlotState::clean;
      x.wanted = false;
      x.matches_file = true;
    } else {  // the file's copy of this unit is lost; so is the run (error_ is sticky)
      if (error_.empty()) error_ = error;
      units_[size_t(x.unit)].slot = -1;
      x = Slot{SlotState::empty, -1, false, false, 0, x.base};
    }
    assign_pending_locked();
  }
  cv_.notify_all();
}

void StateDisk::evict(int u) {
  check_unit(u, "evict");
  std::unique_lock<std::mutex> lk(mu_);
  Unit& un = units_[size_t(u)];
  if (un.pending) {
    pending_.erase(std::find(pending_.begin(), pending_.end(), u));
    un.pending = false;
  }
  const auto busy = [&] {
    if (un.slot < 0) return false;
    const SlotState st = slots_[size_t(un.slot)].state;
    return st == SlotState::reading || st == SlotState::writing;
  };
  cv_.wait(lk, [&] { return !error_.empty() || !busy(); });
  throw_if_failed_locked();
  if (un.slot < 0) return;
  Slot& x = slots_[size_t(un.slot)];
  SF_CHECK(x.state != SlotState::acquired, "StateDisk: unit ", u, " evicted while acquired");
  x = Slot{SlotState::empty, -1, false, false, 0, x.base};
  un.slot = -1;
  assign_pending_locked();
  lk.unlock();
  cv_.notify_all();
}

bool StateDisk::transfers_in_flight_locked() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& x) {
    return x.state == SlotState::reading || x.state == SlotState::writing;
  });
}

void StateDisk::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !error_.empty() || !transfers_in_flight_locked(); });
  throw_if_failed_locked();
}

double disk_tier_seconds(size_t bytes_per_step, const DiskRates& disk, size_t first_last_bytes) {
  SF_CHECK(disk.read > 0 && disk.write > 0 && disk.mixed >= 0, "disk_tier_seconds: rates ", disk.read, ", ",
           disk.write, ", ", disk.mixed, " (read and write must be measured)");
  const double b = double(bytes_per_step);
  const double stream = disk.mixed > 0 ? 2 * b / disk.mixed : b / disk.read + b / disk.write;
  return stream + double(first_last_bytes) / 2 / disk.read + double(first_last_bytes) / 2 / disk.write;
}

}  // namespace sf
