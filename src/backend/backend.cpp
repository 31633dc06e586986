#include "backend/backend.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace sf {

namespace {
class AlignedHostBuffer final : public Buffer {
 public:
  AlignedHostBuffer(void* p, size_t n) : p_(p), n_(n) {}
  ~AlignedHostBuffer() override { std::free(p_); }
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};
// A view of memory someone else owns.
class BorrowedBuffer final : public Buffer {
 public:
  BorrowedBuffer(void* p, size_t n) : p_(p), n_(n) {}
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};
}  // namespace

std::unique_ptr<Buffer> Backend::map_host(void* p, size_t bytes, const std::string&) {
  return std::make_unique<BorrowedBuffer>(p, bytes);
}

std::unique_ptr<Buffer> Backend::alloc_host(size_t bytes, const std::string& what) {
  size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n);
  if (!p) SF_FAIL(out_of_memory, "cannot allocate ", n >> 20, " MiB of host memory for ", what);
  return std::make_unique<AlignedHostBuffer>(p, n);
}

}  // namespace sf
