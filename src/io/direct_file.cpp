#include "io/direct_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <sstream>

#include "core/bytes.h"
#include "core/error.h"
#include "io/anonymous_file.h"

namespace sf {

struct DirectFile::Ring {
  io_uring ring{};
  bool ok = false;  // false: io_uring is unavailable (a seccomp profile may block it): pread/pwrite
};

namespace {

size_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return size_t(s.f_bavail) * size_t(s.f_frsize);
}

// O_DIRECT where the filesystem takes it: at open (O_TMPFILE), else switched on afterwards (the
// named-and-unlinked fallback file). Returns the descriptor; *direct says which it got.
int open_scratch(const std::string& dir, DirectIo want, bool* direct) {
  const int fd = open_anonymous_file(dir, want == DirectIo::when_supported, direct);
  if (fd >= 0 && !*direct && want == DirectIo::when_supported) {
    const int fl = ::fcntl(fd, F_GETFL);
    *direct = fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
  }
  return fd;
}

bool aligned(size_t x) { return x % DirectFile::kAlign == 0; }

}  // namespace

std::string filesystem_name(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "an unreadable filesystem";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x2FC12FC1: return "zfs";
    case 0x65735546: return "fuse";
    case 0xF2F52010: return "f2fs";
  }
  std::ostringstream os;
  os << "fs 0x" << std::hex << static_cast<unsigned long>(s.f_type);
  return os.str();
}

DirectFile::DirectFile(const std::string& dir, size_t bytes, DirectFileOptions opt)
    : dir_(dir), bytes_(bytes), opt_(std::move(opt)), ring_(std::make_unique<Ring>()) {
  SF_REQUIRE(opt_.queue_depth >= 1 && opt_.request_bytes >= kAlign && aligned(opt_.request_bytes),
             "disk tier: queue depth ", opt_.queue_depth, " and request size ", opt_.request_bytes,
             " must be >= 1 and a positive multiple of ", kAlign, " bytes");
  SF_CHECK(aligned(bytes), "DirectFile: ", bytes, " bytes is not a multiple of ", kAlign);
  fd_ = open_scratch(dir, opt_.direct, &direct_);
  if (fd_ < 0)
    SF_FAIL(input, opt_.flag, " ", dir, ": cannot create the optimizer's file there (", std::strerror(errno),
            "); give a writable directory on a fast local disk");
  if (!direct_ && opt_.direct == DirectIo::when_supported)
    std::fprintf(stderr, "note: %s %s (%s) refuses O_DIRECT; its file goes through the page cache\n",
                 opt_.flag.c_str(), dir.c_str(), filesystem_name(dir).c_str());
  int rc = bytes ? ::posix_fallocate(fd_, 0, off_t(bytes)) : 0;
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, off_t(bytes)) == 0 ? 0 : errno;
  if (rc != 0) {
    ::close(fd_);
    SF_FAIL(io, opt_.flag, " ", dir, ": cannot reserve ", format_bytes(bytes), " for the optimizer's file (",
            std::strerror(rc), "; ", format_bytes(free_bytes(dir)), " free there); free space on ", dir,
            " or choose another ", opt_.flag);
  }
  const int qd = opt_.queue_depth;
  ring_->ok = opt_.engine == IoEngine::io_uring && ::io_uring_queue_init(unsigned(qd), &ring_->ring, 0) == 0;
  if (!ring_->ok && opt_.engine == IoEngine::io_uring)
    std::fprintf(stderr, "note: io_uring is unavailable here; %s %s is read and written one request at a time\n",
                 opt_.flag.c_str(), dir.c_str());
  requests_.resize(size_t(qd));
  for (int i = qd; i-- > 0;) free_requests_.push_back(i);
  io_ = std::thread([this] { io_loop(); });
}

DirectFile::~DirectFile() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  io_.join();
  if (ring_->ok) ::io_uring_queue_exit(&ring_->ring);
  ::close(fd_);
}

void DirectFile::sync_and_drop_cache() {
  if (direct_) return;
  if (::fdatasync(fd_) != 0)
    SF_FAIL(io, opt_.flag, " ", dir_, ": syncing the optimizer's file failed (", std::strerror(errno),
            "); free space on ", dir_, " or choose another ", opt_.flag);
  ::posix_fadvise(fd_, 0, off_t(bytes_), POSIX_FADV_DONTNEED);
}

void DirectFile::set_fault_hook_for_test(IoFaultHook hook) {
  std::lock_guard<std::mutex> lk(mu_);
  fault_ = std::move(hook);
}

void DirectFile::submit(IoOp op, size_t off, void* buf, size_t len, IoDone on_done) {
  SF_CHECK(len > 0 && aligned(off) && aligned(len) && aligned(reinterpret_cast<size_t>(buf)) && off + len <= bytes_,
           "DirectFile: transfer of ", len, " bytes at ", off, " is unaligned or past the file's ", bytes_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    transfers_.push_back(Transfer{op, off, len, 0, static_cast<char*>(buf), 0, {}, std::move(on_done)});
  }
  cv_.notify_all();
}

void DirectFile::read(size_t off, void* buf, size_t len) {
  std::promise<std::string> p;
  std::future<std::string> f = p.get_future();
  submit(IoOp::read, off, buf, len, [&p](const std::string& e) { p.set_value(e); });
  const std::string e = f.get();
  if (!e.empty()) SF_FAIL(io, e);
}

void DirectFile::write(size_t off, const void* buf, size_t len) {
  std::promise<std::string> p;
  std::future<std::string> f = p.get_future();
  submit(IoOp::write, off, const_cast<void*>(buf), len, [&p](const std::string& e) { p.set_value(e); });
  const std::string e = f.get();
  if (!e.empty()) SF_FAIL(io, e);
}

std::string DirectFile::failure(const Request& r, int res) const {
  const bool rd = r.t->op == IoOp::read;
  std::string why = res < 0 ? std::strerror(-res) : cat("short ", rd ? "read" : "write", ": ", res, " of ", r.len, " bytes");
  return cat(opt_.flag, " ", dir_, ": ", rd ? "reading " : "writing ", format_bytes(r.len), " at offset ", r.off,
             " of the optimizer's file failed (", why, "; ", format_bytes(free_bytes(dir_)),
             " free there); free space on ", dir_, " or choose another ", opt_.flag);
}

// Hands requests to the ring (or, without io_uring, leaves them for io_loop's pread/pwrite) in
// submission order while a request slot is free. Injected faults complete at once.
void DirectFile::issue_locked(std::vector<Completion>& injected) {
  for (Transfer& t : transfers_) {
    while (t.error.empty() && t.issued < t.len && !free_requests_.empty()) {
      const int ri = free_requests_.back();
      free_requests_.pop_back();
      Request& q = requests_[size_t(ri)];
      q = Request{&t, t.off + t.issued, std::min(opt_.request_bytes, t.len - t.issued)};
      t.issued += q.len;
      ++t.in_flight;
      ++in_flight_;
      size_t n = q.len;
      if (fault_) {
        const IoFault f = fault_(t.op, q.off, q.len);
        if (f.error != 0) {
          injected.push_back({ri, -f.error});
          continue;
        }
        n = std::min(n, f.short_bytes);
      }
      if (!ring_->ok) {
        injected.push_back({ri, 0, ssize_t(n)});
        continue;
      }
      io_uring_sqe* sqe = ::io_uring_get_sqe(&ring_->ring);  // the ring has queue_depth entries
      SF_CHECK(sqe != nullptr, "DirectFile: io_uring submission queue full");
      char* p = t.buf + (q.off - t.off);
      if (t.op == IoOp::read) ::io_uring_prep_read(sqe, fd_, p, unsigned(n), q.off);
      else ::io_uring_prep_write(sqe, fd_, p, unsigned(n), q.off);
      ::io_uring_sqe_set_data64(sqe, uint64_t(ri));
    }
  }
}

void DirectFile::complete_locked(const Completion& c, std::vector<Transfer*>& finished) {
  Request& q = requests_[size_t(c.request)];
  Transfer& t = *q.t;
  if (c.res != int(q.len) && t.error.empty()) t.error = failure(q, c.res);
  --t.in_flight;
  --in_flight_;
  q.t = nullptr;
  free_requests_.push_back(c.request);
  if (t.in_flight == 0 && (t.issued == t.len || !t.error.empty())) finished.push_back(&t);
}

void DirectFile::io_loop() {
  std::vector<Completion> done;
  std::vector<Transfer*> finished;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    done.clear();
    issue_locked(done);
    const bool waiting = size_t(in_flight_) > done.size();  // requests the ring holds
    lk.unlock();
    for (Completion& c : done)  // without io_uring: the requests run here, one at a time
      if (c.sync_bytes >= 0) {
        const Request& q = requests_[size_t(c.request)];  // not reused before complete_locked
        char* p = q.t->buf + (q.off - q.t->off);
        const size_t n = size_t(c.sync_bytes);
        const ssize_t r = q.t->op == IoOp::read ? ::pread(fd_, p, n, off_t(q.off)) : ::pwrite(fd_, p, n, off_t(q.off));
        c.res = r < 0 ? -errno : int(r);
      }
    if (ring_->ok) {
      // The kernel may be short of resources for a moment; the ring never holds more than
      // queue_depth requests, so nothing else can refuse them.
      int rc;
      while ((rc = ::io_uring_submit(&ring_->ring)) == -EINTR || rc == -EAGAIN || rc == -EBUSY) std::this_thread::yield();
      io_uring_cqe* cqe = nullptr;
      if (waiting && done.empty())
        while (::io_uring_wait_cqe(&ring_->ring, &cqe) == -EINTR) {
        }
      while (::io_uring_peek_cqe(&ring_->ring, &cqe) == 0) {
        done.push_back({int(::io_uring_cqe_get_data64(cqe)), cqe->res});
        ::io_uring_cqe_seen(&ring_->ring, cqe);
      }
    }
    lk.lock();
    finished.clear();
    for (const Completion& c : done) complete_locked(c, finished);
    if (!finished.empty()) {
      lk.unlock();
      for (Transfer* t : finished) t->on_done(t->error);
      lk.lock();
      for (Transfer* t : finished) transfers_.remove_if([t](const Transfer& x) { return &x == t; });
    }
    if (in_flight_ > 0) continue;
    const auto has_work = [this] {
      return std::any_of(transfers_.begin(), transfers_.end(),
                         [](const Transfer& t) { return t.error.empty() && t.issued < t.len; });
    };
    if (stop_ && transfers_.empty()) return;
    cv_.wait(lk, [&] { return has_work() || (stop_ && transfers_.empty()); });
  }
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One sequential pass over [0, bytes) of a file.
struct Pass {
  DirectFile* f;
  IoOp op;
  size_t bytes;
};

// Runs the passes at once, each in 16 MiB transfers all queued on its own file's ring (two
// rings keep reads and writes in flight together); returns the seconds until all are done.
double timed_passes(const std::vector<Pass>& passes, char* buf) {
  constexpr size_t kChunk = size_t(16) << 20;
  std::mutex mu;
  std::condition_variable cv;
  size_t left = 0;
  for (const Pass& p : passes) left += p.bytes / kChunk;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Pass& p : passes)
    for (size_t off = 0; off < p.bytes; off += kChunk)
      p.f->submit(p.op, off, buf + off % (size_t(64) << 20), kChunk, [&](const std::string& e) {
        std::lock_guard<std::mutex> lk(mu);
        if (error.empty()) error = e;
        if (--left == 0) cv.notify_all();
      });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
  if (!error.empty()) SF_FAIL(io, error);
  return seconds_since(t0);
}

}  // namespace

DiskRates measure_disk_rates(const std::string& dir, size_t bytes, const DirectFileOptions& opt) {
  constexpr size_t kUnit = size_t(32) << 20;
  SF_CHECK(bytes >= kUnit && bytes % kUnit == 0, "measure_disk_rates: ", bytes, " bytes is not a multiple of 32 MiB");
  DirectFile f(dir, bytes, opt);
  // Every transfer's source or target, as the tier's slots are: huge pages, faulted in (4 KiB
  // pages made the kernel pin 256 pages per request: 20-30% slower on the 2-core dev box).
  const size_t buf_bytes = std::min(bytes, size_t(64) << 20);
  void* mem = ::mmap(nullptr, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SF_REQUIRE(mem != MAP_FAILED, "disk probe: cannot map ", format_bytes(buf_bytes), " of host memory (",
             std::strerror(errno), ")");
  std::unique_ptr<void, std::function<void(void*)>> buf(mem, [buf_bytes](void* p) { ::munmap(p, buf_bytes); });
  ::madvise(mem, buf_bytes, MADV_HUGEPAGE);
  std::memset(mem, 0x5a, buf_bytes);  // not zeros: some devices shortcut them
  char* b = static_cast<char*>(mem);
  // Buffered, a pass counts until its pages are on the disk, and none is left for the next.
  const auto settle = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    f.sync_and_drop_cache();
    return seconds_since(t0);
  };
  DirectFile g(dir, bytes / 2, opt);  // read while f is written, for the mixed rate
  timed_passes({{&f, IoOp::write, bytes}, {&g, IoOp::write, bytes / 2}}, b);  // allocates the reserved blocks
  settle();
  g.sync_and_drop_cache();
  DiskRates r;
  r.direct = f.direct();
  const double w = timed_passes({{&f, IoOp::write, bytes}}, b);
  r.write = double(bytes) / (w + settle());
  r.read = double(bytes) / timed_passes({{&f, IoOp::read, bytes}}, b);
  settle();
  const double m = timed_passes({{&f, IoOp::write, bytes / 2}, {&g, IoOp::read, bytes / 2}}, b);
  r.mixed = double(bytes) / (m + settle());
  return r;
}

}  // namespace sf
