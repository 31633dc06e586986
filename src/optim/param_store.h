// The persistent training state on the host: for every unit of the layout, flat fp32 master
// weights and AdamW moments m and v (12 bytes per parameter). Only the CPU touches these, so
// they are pageable memory (transparent huge pages requested), not pinned: pinning ~100 GB
// is slow and can fail, and DMA only needs the small bf16 staging buffers. (The one exception:
// the sliding executor maps the embedding table, ~2 GB at 8B, so the GPU gathers its rows.)
//
// With a moments directory (an NVMe disk), m and v (8 of the 12 bytes) live in one file
// there, mapped into memory: the page cache keeps what RAM allows and the kernel reads and
// writes the rest as the optimizer sweeps, so an 8B model trains on a 64 GB workstation.
// The file is anonymous (O_TMPFILE where the filesystem has it): nothing is left behind,
// even after a crash; checkpoints copy the moments out as usual.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "optim/param_range.h"

namespace sf {

// Anonymous zero-filled host memory (mmap), released on destruction.
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(size_t bytes, const char* what);
  // bytes of the file fd from `offset` (page-aligned), shared: writes go to the file.
  HostArray(int fd, size_t offset, size_t bytes, const char* what);
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
};

class ParamStore {
 public:
  // moments_dir empty: everything in RAM; else m and v in a file in that directory,
  // `streamed` when the page cache cannot hold them (see moments_done).
  // One entry per unit (model/param_layout.h: state_units builds them from a ModelLayout).
  explicit ParamStore(const std::vector<StateUnit>& units, const std::string& moments_dir = "",
                      bool streamed = false);
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int n_units() const { return int(units_.size()); }
  int64_t numel(int u) const { return units_[size_t(u)].numel; }
  float* master(int u) const { return units_[size_t(u)].master.as<float>(); }
  float* m(int u) const { return units_[size_t(u)].m.as<float>(); }
  float* v(int u) const { return units_[size_t(u)].v.as<float>(); }
  const std::vector<ParamRange>& ranges(int u) const { return units_[size_t(u)].ranges; }
  std::vector<float*> master_ptrs() const;
  size_t host_bytes() const;  // in RAM for sure (the moments' file excluded)
  bool moments_on_disk() const { return fd_ >= 0; }
  // For the optimizer's sweep over moments on disk (a no-op in RAM): start reading unit u's
  // m and v now. (Write-back is left to the kernel: starting it early made the next step's
  // writes wait for the disk even when the page cache held every moment: 206 against 339
  // tokens/s on the dev box's `bench --size small`.)
  void prefetch_moments(int u) const;
  // Unit u's update is done (streamed moments; a no-op otherwise): its write-back starts, and
  // the unit done before it is waited for and dropped from the page cache, so the sweep
  // streams at the disk's pace. Left to the kernel's reclaim, 4 KiB dirty pages were written
  // one by one: on the dev box in an 8000 MiB cgroup, 2.9 GB of moments per step, steps
  // slowed from 4.0 to 10.3 s over 8 steps; streamed, they held at 5.6-6.4 s (6.3 predicted).
  void moments_done(int u);

  int64_t step = 0;  // optimizer steps taken (AdamW bias correction uses step + 1 next)

 private:
  struct UnitState {
    int64_t numel = 0;
    HostArray master, m, v;
    size_t file_offset = 0;  // of m in the moments' file (v follows, page-aligned)
    std::vector<ParamRange> ranges;
  };
  std::vector<UnitState> units_;
  int fd_ = -1;  // the moments' file, or -1
  bool streamed_ = false;
  std::mutex done_mu_;
  int last_done_ = -1;  // unit whose write-back was started last
};

// Bytes free for an unprivileged user on the filesystem of `dir` (0 if it cannot be read).
size_t disk_free_bytes(const std::string& dir);
// The moments' file size for these units (m and v of every unit, each page-aligned).
size_t moments_file_bytes(const std::vector<StateUnit>& units);

}  // namespace sf
