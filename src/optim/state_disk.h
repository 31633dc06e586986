// The optimizer state on disk, streamed through a few RAM slots (the disk tier of
// --optimizer-dir). It owns one DirectFile (O_DIRECT + io_uring) holding, per unit, an extent of
// opaque parts (AdamW m and v in whatever format the store keeps them, their scales...), each
// part 4 KiB-aligned in the extent, and n_slots RAM slots of the largest extent's size, laid
// out like an extent. The file starts zero-filled.
//
// The optimizer's sweep: prefetch(u) starts reading unit u into a slot (at once if one is free
// or holds a clean copy, else as soon as a write-back frees one: it never blocks; a unit
// prefetched and then not acquired gives its slot up to an acquire that would wait for ever);
// acquire(u) waits for the bytes and hands out the parts' pointers, valid until release(u);
// release(u) starts the write-back and frees the slot once it is written. With two slots the
// disk reads the next unit and writes the last one while the CPU updates this one.
// A slot keeps its unit after the write-back (clean) until another unit needs it, so
// acquiring a unit again soon reads nothing.
//
// Errors: the first failed transfer (ENOSPC, EIO, a short write) is kept, and every later call
// throws Error(io) with its message (the file's contents are no longer trusted); a run stops,
// and its checkpoints, written elsewhere, stay as they were. Thread-safe: the calls may come
// from different threads, but each unit is acquired by one caller at a time.
#pragma once
#include <array>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/direct_file.h"

namespace sf {

// A unit's parts in its slot, as laid out by the StateDisk's constructor.
struct UnitBytes {
  static constexpr int kMaxParts = 4;
  std::array<std::byte*, kMaxParts> part{};
  std::array<size_t, kMaxParts> bytes{};
  int n_parts = 0;
};

// How acquire fills a slot the unit is not already in.
enum class SlotFill {
  read,       // from the file (the optimizer's update)
  overwrite,  // not at all: the caller writes every byte of every part (a checkpoint's resume)
};

// What release does with the slot's bytes.
enum class SlotRelease {
  write_back,  // they changed: written to the file
  unchanged,   // the caller only read them (a checkpoint's save): nothing is written
};

class StateDisk {
 public:
  // unit_parts[u]: the byte sizes of unit u's parts (1..kMaxParts, any size; zero-sized parts
  // allowed). Throws Error(io) naming opt.flag when the file cannot be made or reserved.
  StateDisk(const std::string& dir, const std::vector<std::vector<size_t>>& unit_parts, int n_slots = 2,
            DirectFileOptions opt = {});
  ~StateDisk();  // waits for the transfers in flight; a pending error is dropped with the file
  StateDisk(const StateDisk&) = delete;
  StateDisk& operator=(const StateDisk&) = delete;

  int n_units() const { return int(units_.size()); }
  int n_slots() const { return int(slots_.size()); }
  size_t extent_bytes(int u) const { return units_[size_t(u)].extent; }
  size_t file_bytes() const { return file_->bytes(); }
  size_t slot_bytes() const { return slot_bytes_; }  // one slot (RAM: n_slots() of these)
  bool direct() const { return file_->direct(); }
  const std::string& dir() const { return file_->dir(); }

  void prefetch(int u);
  UnitBytes acquire(int u, SlotFill fill = SlotFill::read);
  void release(int u, SlotRelease how = SlotRelease::write_back);
  // Waits until no transfer is in flight (prefetches not yet started stay queued); throws the
  // first error. A checkpoint's save calls it first: the file then holds every released unit.
  void flush();

  // Drops whatever a slot holds of unit u (waiting for its transfer first; a prefetch not yet
  // started is dropped too), so that the file alone has it: for a caller that reads or writes
  // the unit through a mapping of the file. SF_CHECK: not while acquired. Throws Error(io).
  void evict(int u);
  // Where part p of unit u lies in the file (for that mapping), and the descriptor.
  size_t part_file_offset(int u, int p) const { return units_[size_t(u)].offset + units_[size_t(u)].part_offset[size_t(p)]; }
  int fd() const { return file_->fd(); }

  // The file's size for these parts (each part and so each extent 4 KiB-aligned).
  static size_t file_bytes_for(const std::vector<std::vector<size_t>>& unit_parts);

  // Tests: faults injected into the file's requests (DirectFile::set_fault_hook_for_test).
  void set_fault_hook_for_test(IoFaultHook hook) { file_->set_fault_hook_for_test(std::move(hook)); }

 private:
  enum class SlotState { empty, clean, reading, ready, acquired, writing };
  struct Slot {
    SlotState state = SlotState::empty;
    int unit = -1;
    bool wanted = false;   // prefetched again while writing: ready once written
    bool matches_file = false;  // the bytes are the file's (read, or written back)
    uint64_t last_use = 0;
    std::byte* base = nullptr;
  };
  struct Unit {
    size_t offset = 0, extent = 0;
    std::vector<size_t> part_offset, part_bytes;
    int slot = -1;      // the slot holding it, or -1
    bool pending = false;  // waiting for a slot
    int waiting = 0;       // acquires waiting for it (its copy is not stolen)
    SlotFill pending_fill = SlotFill::read;
  };

  void check_unit(int u, const char* what) const;
  void throw_if_failed_locked() const;
  void queue_locked(int u, SlotFill fill);
  void assign_pending_locked();
  int pick_slot_locked() const;
  bool steal_slot_locked(int u);
  void start_read_locked(int s, int u);
  void on_read(int s, const std::string& error);
  void on_written(int s, const std::string& error);
  bool transfers_in_flight_locked() const;

  std::vector<Unit> units_;
  size_t slot_bytes_ = 0;
  struct Memory;
  std::unique_ptr<Memory> memory_;
  std::vector<Slot> slots_;
  std::deque<int> pending_;  // units waiting for a slot, in prefetch order
  uint64_t clock_ = 0;
  std::string error_;        // the first failure
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<DirectFile> file_;  // last: destroyed first, its callbacks still see the slots
};

// Seconds per optimizer step the disk tier costs when the disk alone is the limit: every byte
// of state read once and written once (bytes_per_step: StateDisk::file_bytes), reads and writes
// overlapped as the tier does, at the disk's measured mixed rate (DiskRates::mixed, reads plus
// writes). Without one (0): one after the other, bytes / read + bytes / write. The first unit's
// read and the last one's write-back stand out of the step: first_last_bytes (two units' extents)
// are added at the sequential rates.
double disk_tier_seconds(size_t bytes_per_step, const DiskRates& disk, size_t first_last_bytes = 0);

}  // namespace sf
