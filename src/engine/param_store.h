// The persistent training state on the host: for every unit of the layout, flat fp32 master
// weights and AdamW moments m and v (12 bytes per parameter). Only the CPU touches these, so
// they are pageable memory (transparent huge pages requested), not pinned: pinning ~100 GB
// is slow and can fail, and DMA only needs the small bf16 staging buffers. (The one exception:
// the sliding executor maps the embedding table, ~2 GB at 8B, so the GPU gathers its rows.)
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/param_layout.h"
#include "optim/adamw.h"  // ParamRange

namespace sf {

// Anonymous zero-filled host memory (mmap), released on destruction.
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(size_t bytes, const char* what);
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
  explicit ParamStore(const ModelLayout& layout);

  int n_units() const { return int(units_.size()); }
  int64_t numel(int u) const { return units_[size_t(u)].numel; }
  float* master(int u) const { return units_[size_t(u)].master.as<float>(); }
  float* m(int u) const { return units_[size_t(u)].m.as<float>(); }
  float* v(int u) const { return units_[size_t(u)].v.as<float>(); }
  const std::vector<ParamRange>& ranges(int u) const { return units_[size_t(u)].ranges; }
  std::vector<float*> master_ptrs() const;
  size_t host_bytes() const;

  int64_t step = 0;  // optimizer steps taken (AdamW bias correction uses step + 1 next)

 private:
  struct UnitState {
    int64_t numel = 0;
    HostArray master, m, v;
    std::vector<ParamRange> ranges;
  };
  std::vector<UnitState> units_;
};

}  // namespace sf
