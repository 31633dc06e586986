// The host's one copy of the training state (docs/MULTI_GPU.md, "Host state in POSIX shared
// memory"): a named POSIX shared-memory region that local rank 0 creates and the other local
// ranks map, the same bytes in every process.
//
// Who does what: local rank 0 create()s each region (the name must not exist: O_EXCL), the
// other local ranks open() it after a barrier, and once all have mapped it (a second barrier)
// rank 0 unlink()s the name, so nothing is left in /dev/shm from then on, even after a crash
// (the mappings keep the memory alive until the last process unmaps it). create() commits the
// whole size at once (posix_fallocate), so a full /dev/shm is an Error now rather than a
// SIGBUS when a page is first touched hours later. Errors (sf::Error) name the region, the
// bytes, and the fix (a stale name from a crashed run, /dev/shm's size, a missing creator).
#pragma once
#include <cstddef>
#include <string>

namespace sf::dist {

class SharedRegion {
 public:
  static SharedRegion create(const std::string& name, size_t bytes);
  static SharedRegion open(const std::string& name, size_t bytes);
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  // Unmaps; the creator also removes the name if unlink() was not called (a failed start).
  ~SharedRegion();

  // Removes the name; the mappings stay valid. The creator's call; idempotent.
  void unlink();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedRegion() = default;
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false, linked_ = false;
};

// "/slideformer-<run id>-<what>": a region's name (what: e.g. "state", "homes").
std::string shared_region_name(const std::string& run_id, const std::string& what);
// 16 random hex digits (rank 0 makes it and broadcasts it), so that two runs never collide.
std::string new_run_id();
// Bytes free in /dev/shm (0 if it cannot be asked).
size_t shm_free_bytes();

}  // namespace sf::dist
