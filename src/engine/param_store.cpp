#include "engine/param_store.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

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

ParamStore::ParamStore(const ModelLayout& layout) {
  for (auto& unit : layout.units) {
    UnitState s;
    s.numel = unit.numel;
    size_t bytes = size_t(unit.numel) * sizeof(float);
    s.master = HostArray(bytes, "fp32 master weights");
    s.m = HostArray(bytes, "AdamW first moments");
    s.v = HostArray(bytes, "AdamW second moments");
    // Fault the moments in now, spread over the threads (they are zero-filled on first touch):
    // left to the first AdamW sweep, 64 GB of faults at 8B cost that step ~9 s.
    for (HostArray* a : {&s.m, &s.v}) {
      char* p = a->as<char>();
      host_pool().parallel_for(int64_t(a->bytes()), [&](int64_t b, int64_t e) {
        std::memset(p + b, 0, size_t(e - b));
      }, int64_t(1) << 21);
    }
    for (auto& slot : unit.params) {
      // Merge with the previous range when contiguous and of the same decay group.
      if (!s.ranges.empty() && s.ranges.back().decay == slot.decay &&
          s.ranges.back().offset + s.ranges.back().numel == slot.offset)
        s.ranges.back().numel += slot.numel();
      else
        s.ranges.push_back({slot.offset, slot.numel(), slot.decay});
    }
    units_.push_back(std::move(s));
  }
}

std::vector<float*> ParamStore::master_ptrs() const {
  std::vector<float*> p;
  for (auto& u : units_) p.push_back(u.master.as<float>());
  return p;
}

size_t ParamStore::host_bytes() const {
  size_t n = 0;
  for (auto& u : units_) n += u.master.bytes() + u.m.bytes() + u.v.bytes();
  return n;
}

}  // namespace sf
