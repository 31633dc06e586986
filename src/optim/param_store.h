// The persistent training state on the host: for every unit of the layout, its master weights
// and AdamW moments m and v in the StateFormat the store was built with (optim/state_format.h):
// fp32 master + fp32 m, v (12 bytes per parameter, the default), bf16 or int8 moments (int8:
// block-wise codes plus one fp32 absmax scale per block and moment), fp32 or bf16 master. Each
// unit's buffers are sized by unit_state_layout; host_bytes() is exactly the sum of
// unit_state_bytes over the units (with everything in RAM). Only the CPU touches these, so they
// are pageable memory (transparent huge pages requested), not pinned: pinning ~100 GB is slow
// and can fail, and DMA only needs the small bf16 staging buffers. (The one exception: the
// sliding executor maps the embedding table, ~2 GB at 8B, so the GPU gathers its rows.)
//
// Access: state(u) is the format-agnostic view the optimizer kernels take (state_adamw.h);
// master(u) / m(u) / v(u) are the fp32 arrays and exist only where the format has them
// (SF_CHECK(internal) otherwise: a caller that reaches them in a compact run is a bug);
// read_master_f32 / write_master_f32 move a unit's weights in and out as fp32 in every format
// (bf16 master: decoded exactly, encoded round-to-nearest-even).
//
// With a moments directory (an NVMe disk), m and v (8 of the 12 bytes in fp32; the compact
// moment bytes otherwise) live in one anonymous file there, the disk tier (optim/state_disk.h):
// the optimizer's sweep moves each unit's m and v through one of kDiskSlots RAM slots with
// O_DIRECT and io_uring (prefetch_disk_unit, acquire_disk_unit, disk_unit_done), so an 8B
// model trains on a 64 GB workstation at the disk's speed, without the page cache. The int8
// scales stay in RAM (1/64 of the codes' bytes). With DiskUnits::masters, a bf16 master goes
// into the same extent as its unit's moments and moves with them: for a run whose weights
// stream from compute-dtype homes (copies), where the optimizer alone reads the master. Not
// streamed (the planner's "cached" mode: the page cache can hold them), the same file is
// buffered instead. The file has no name: nothing is left behind, even after a crash;
// checkpoints copy the state out as usual.
//
// Who sees which bytes of a unit on disk: between acquire_disk_unit(u) and disk_unit_done(u),
// state(u) / m(u) / v(u) (and master_bf16(u), master on disk) point into its slot. Outside
// that (checkpoints, tests, engine paths that do not acquire), they point into a shared
// mapping of the file: the slot's copy is dropped first (written back if it was changed), and
// the mapping's pages are written and dropped before the unit's next prefetch, so both views
// always agree with the file.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "optim/param_range.h"
#include "optim/state_disk.h"
#include "optim/state_format.h"

namespace sf {

// Anonymous zero-filled host memory (mmap), released on destruction.
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(size_t bytes, const char* what);
  // bytes of the file fd from `offset` (page-aligned), shared: writes go to the file.
  HostArray(int fd, size_t offset, size_t bytes, const char* what);
  // bytes at p, owned by the caller (ParamStore's external memory): never unmapped here.
  static HostArray view(void* p, size_t bytes);
  ~HostArray();
  HostArray(HostArray&& o) noexcept { *this = std::move(o); }
  HostArray& operator=(HostArray&& o) noexcept;
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return n_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  bool owned_ = true;  // false: a view of the caller's memory
};

// Memory from outside for a ParamStore's state (data parallel: the ranks' one copy, in a
// region they share; the engine maps it, optim does not know from where). Zero-filled by its
// creator; base 4096-byte aligned; bytes at least ParamStore::external_bytes.
struct ExternalStateMemory {
  void* base = nullptr;  // null: the store allocates its own
  size_t bytes = 0;
};

// Which units' state a store with a moments directory keeps in the file.
struct DiskUnits {
  int count = -1;  // units whose m and v go (disk_unit_choice picks them); -1: every unit's
  // Their bf16 masters too (master_disk_choice: never the embedding's, whose table the GPU
  // gathers rows from). Only for a bf16 master: an fp32 one is the f32 compute's weights.
  bool masters = false;
};

class ParamStore {
 public:
  // Stochastic rounding's seed when the run gives none (the trainer sets --seed's).
  static constexpr uint64_t kDefaultRoundingSeed = 0x5f3759df9e3779b9ull;

  // One entry per unit (model/param_layout.h: state_units builds them from a ModelLayout),
  // each unit's state in `format`. moments_dir empty: everything in RAM; else m and v in a
  // file in that directory, O_DIRECT when `streamed` (the page cache cannot hold them), else
  // buffered: of the units `disk` names (and their masters, disk.masters), the others' in
  // RAM. Throws Error naming --optimizer-dir when the file cannot be made or reserved, and
  // Error(internal) for masters on disk that are not bf16.
  // external.base set: every array (master, m, v, scales) is carved from that memory instead,
  // in unit order, each 4096-byte aligned; nothing is allocated or faulted in, the contents
  // are the memory's (several stores over the same memory see the same state; each keeps its
  // own step counter). No moments directory then (Error naming --optimizer-dir).
  explicit ParamStore(const std::vector<StateUnit>& units, StateFormat format = {},
                      const std::string& moments_dir = "", bool streamed = false, DiskUnits disk = {},
                      ExternalStateMemory external = {});
  // The bytes of external memory a store of these units in `format` carves.
  static size_t external_bytes(const std::vector<StateUnit>& units, StateFormat format = {});
  // The fp32 store with its moments in moments_dir (the form before compact formats).
  ParamStore(const std::vector<StateUnit>& units, const std::string& moments_dir,
             bool streamed = false)
      : ParamStore(units, StateFormat{}, moments_dir, streamed) {}
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int n_units() const { return int(units_.size()); }
  int64_t numel(int u) const { return units_[size_t(u)].numel; }
  const std::vector<ParamRange>& ranges(int u) const { return units_[size_t(u)].ranges; }
  StateFormat format() const { return format_; }
  // Byte sizes and per-range encodings of unit u's buffers (optim/state_format.h).
  const UnitStateLayout& layout(int u) const { return units_[size_t(u)].layout; }
  // Unit u's state for the optimizer kernels and the format conversions (state_adamw.h), with
  // this store's rounding_seed. Valid while the store lives; with moments on disk, m and v
  // until the unit's next acquire_disk_unit or disk_unit_done (see above).
  UnitStateView state(int u) const;

  // fp32 arrays of numel(u) floats; SF_CHECK(internal) unless the format stores them so.
  float* master(int u) const;
  float* m(int u) const;
  float* v(int u) const;
  // The bf16 master (numel(u) values); SF_CHECK(internal) unless the master is bf16. On disk:
  // valid like m(u) (see above).
  uint16_t* master_bf16(int u) const;
  // Unit u's weights as numel(u) floats, in every format: out receives them (bf16 master:
  // exact), or the master is overwritten from in (bf16: round to nearest even).
  void read_master_f32(int u, float* out) const;
  void write_master_f32(int u, const float* in);
  // Every unit's fp32 master (fp32 master only; SF_CHECK otherwise): for the loaders that
  // fill all units at once.
  std::vector<float*> master_ptrs() const;

  // Bytes this store holds in RAM: the sum of unit_state_bytes over the units, without what
  // is the file's (the tier's slots are disk_slot_bytes more).
  size_t host_bytes() const;
  bool moments_on_disk() const { return disk_ != nullptr; }  // of any unit
  bool moments_on_disk(int u) const { return disk_ != nullptr && on_disk_[size_t(u)]; }
  bool master_on_disk(int u) const { return disk_ != nullptr && master_on_disk_[size_t(u)]; }
  // RAM slots of the disk tier: two, so that the disk reads the next unit and writes the last
  // one while the CPU updates this one.
  static constexpr int kDiskSlots = 2;
  // For the optimizer's sweep over the units on disk (each a no-op for a unit in RAM).
  // prefetch: start reading unit u's m and v (and master, on disk) into a slot (never
  // blocks). acquire: wait for them; state(u), m(u), v(u), master_bf16(u) then point into
  // the slot (a no-op when held already). done: the update is over; the slot is written back
  // (held), or, for a unit reached through the mapping (streamed), that write-back starts and
  // the unit done before it is written and dropped from the page cache. All throw Error(io)
  // once the disk failed (the run stops).
  void prefetch_disk_unit(int u) const;
  void acquire_disk_unit(int u) const;
  void disk_unit_done(int u);
  // Every write-back is on the disk (checkpoints); throws Error(io) when one failed.
  void flush_disk() const;
  // The caller is done with unit u's view through the mapping (a load, an init): what it
  // wrote goes to the file and its pages leave this process (they would count as its RSS
  // until the next sweep; streamed, they leave the page cache too). A no-op for a unit in
  // RAM or not mapped. write_master_f32 does it for a master on disk. Throws Error(io).
  void settle_mapping(int u) const;

  int64_t step = 0;  // optimizer steps taken (AdamW bias correction uses step + 1 next)
  // Seeds the bf16 master's stochastic rounding (state_format.h); the trainer sets it from
  // --seed and a checkpoint records it, so a resumed run rounds as the uninterrupted one.
  uint64_t rounding_seed = kDefaultRoundingSeed;

 private:
  struct UnitState {
    int64_t numel = 0;
    UnitStateLayout layout;
    HostArray master, m, v, m_scale, v_scale;  // scales: int8 moments only; on disk m, v map the file
    std::vector<ParamRange> ranges;
  };
  void allocate_in_ram(UnitState& s);
  void map_from_disk(UnitState& s, int u);
  const UnitState& unit(int u) const { return units_[size_t(u)]; }
  // m, v, master: the slot's, the mapping's or RAM (see above).
  struct Arrays {
    void *m, *v, *master;
  };
  Arrays arrays_of(int u) const;
  std::vector<const HostArray*> mapped_arrays(int u) const;  // unit u's arrays that map the file
  void retire_mapping_locked(int u) const;
  void drop_mapped_pages(int u) const;

  StateFormat format_;
  std::vector<UnitState> units_;
  std::unique_ptr<StateDisk> disk_;  // the moments' tier, or null
  std::vector<char> on_disk_;        // per unit: its m and v are the tier's (disk_unit_choice)
  std::vector<char> master_on_disk_; // per unit: its master is the tier's too (master_disk_choice)
  bool streamed_ = false;
  mutable std::mutex disk_mu_;           // guards the three below
  mutable std::vector<UnitBytes> held_;  // per unit: its slot while acquired (n_parts 0: not)
  mutable std::vector<char> mapped_;     // per unit: the mapping was handed out since its last prefetch
  int last_done_ = -1;  // streamed, through the mapping: the unit whose write-back started last
};

// Which units' moments go to the disk when only `disk_units` of them do (-1, or at least the
// unit count: all): the layers first, spread evenly over the optimizer's sweep so that the
// disk streams while the CPU updates the units in RAM between them, then the head, then the
// embedding (whose rows a step updates sparsely).
std::vector<char> disk_unit_choice(const std::vector<StateUnit>& units, int disk_units);
// Which units' masters go with their moments (disk.masters): those of disk_unit_choice but
// the embedding's (unit 0: its table is the one the GPU gathers rows from).
std::vector<char> master_disk_choice(const std::vector<StateUnit>& units, DiskUnits disk);

// Bytes of RAM the disk tier's slots take for these units (kDiskSlots x the largest unit's
// state on disk): host memory beyond host_bytes (the master, the scales and what stays in
// RAM) with a disk tier.
size_t disk_slot_bytes(const std::vector<StateUnit>& units, StateFormat format = {}, DiskUnits disk = {});

// Bytes free for an unprivileged user on the filesystem of `dir` (0 if it cannot be read).
size_t disk_free_bytes(const std::string& dir);
// The tier's file size for these units in `format` (m and v, and the masters with
// disk.masters, of the units on disk, each page-aligned); without a format, fp32 moments.
size_t disk_file_bytes(const std::vector<StateUnit>& units, StateFormat format = {}, DiskUnits disk = {});

}  // namespace sf
