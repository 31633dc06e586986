// An anonymous scratch file for large aligned transfers at the disk's speed: O_DIRECT (no page
// cache, so it does not compete with RAM), its blocks reserved up front (a full disk shows at
// construction, not in the middle of a run), and one io_uring queue kept full by an I/O thread.
// A transfer (an extent of any size) is split into requests of `request_bytes`, up to
// `queue_depth` of them in flight across all transfers, in submission order.
//
// Where the filesystem refuses O_DIRECT the file is buffered instead (one note on stderr naming
// the filesystem). Every completion is checked: a failed or short request fails its transfer
// with a message naming the directory, the operation, the errno text and the fix; requests of
// that transfer not yet issued are dropped. The file has no name and vanishes with the process.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>
#include <vector>

namespace sf {

enum class IoOp { read, write };

// Tests only: what becomes of one request before it is issued. error != 0: it is not issued and
// completes with -error (ENOSPC, EIO...); short_bytes < the request's length: only that many bytes
// are issued (a short transfer). Production code never sets a hook.
struct IoFault {
  int error = 0;
  size_t short_bytes = size_t(-1);
};
using IoFaultHook = std::function<IoFault(IoOp op, size_t offset, size_t len)>;

// Whether the file bypasses the page cache. buffered is the fallback where O_DIRECT is refused,
// and bench_disk_tier's comparison.
enum class DirectIo { when_supported, buffered };
// Who moves the requests. blocking (pread/pwrite on the I/O thread, one at a time) is the
// fallback where io_uring is unavailable (a container's seccomp profile may block it).
enum class IoEngine { io_uring, blocking };

struct DirectFileOptions {
  std::string flag = "--optimizer-dir";   // the flag that chose the directory, named in errors
  // One request, and how many are in flight: 16 MiB in all. bench_disk_tier --sweep-queue on
  // the dev VM: 1 MiB x 16 within 5% of the best (4 MiB x 16), 256 KiB x 2 15-25% below.
  size_t request_bytes = size_t(1) << 20;
  int queue_depth = 16;
  DirectIo direct = DirectIo::when_supported;
  IoEngine engine = IoEngine::io_uring;
};

// A transfer's completion, on the I/O thread: error is empty when every byte moved.
using IoDone = std::function<void(const std::string& error)>;

class DirectFile {
 public:
  static constexpr size_t kAlign = 4096;  // offsets, lengths and buffer addresses (O_DIRECT)

  // An anonymous file of `bytes` (a kAlign multiple) in dir, reserved. Throws Error naming
  // opt.flag and dir: input when it cannot be created there, io when it cannot be reserved.
  DirectFile(const std::string& dir, size_t bytes, DirectFileOptions opt = {});
  ~DirectFile();  // waits for the transfers in flight (their callbacks run)
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  bool direct() const { return direct_; }
  size_t bytes() const { return bytes_; }
  const std::string& dir() const { return dir_; }
  const DirectFileOptions& options() const { return opt_; }
  // The descriptor, for a shared mapping of the file (ParamStore's view outside the optimizer's
  // sweep); the kernel keeps the mapping coherent with the direct transfers of other ranges.
  int fd() const { return fd_; }

  // Starts moving len bytes between buf and [off, off + len) of the file; returns at once.
  // off, len and buf must be kAlign-aligned and inside the file (SF_CHECK). on_done runs once on
  // the I/O thread after the last request completed; it must not call back into this file's
  // blocking read/write.
  void submit(IoOp op, size_t off, void* buf, size_t len, IoDone on_done);
  // submit and wait; throws Error(io) with the transfer's message.
  void read(size_t off, void* buf, size_t len);
  void write(size_t off, const void* buf, size_t len);

  // Buffered only (a no-op with O_DIRECT): the written pages go to the disk and leave the page
  // cache, so that the next read comes from the disk. Throws Error(io).
  void sync_and_drop_cache();

  void set_fault_hook_for_test(IoFaultHook hook);

 private:
  struct Transfer {
    IoOp op;
    size_t off, len, issued = 0;  // bytes handed to the ring so far
    char* buf;
    int in_flight = 0;
    std::string error;
    IoDone on_done;
  };
  struct Request {  // one ring entry's user data
    Transfer* t = nullptr;
    size_t off = 0, len = 0;
  };
  struct Completion {
    int request;
    int res;                  // bytes moved, or -errno
    ssize_t sync_bytes = -1;  // >= 0: not issued yet, io_loop runs it with pread/pwrite (no io_uring)
  };

  void io_loop();
  void issue_locked(std::vector<Completion>& injected);
  void complete_locked(const Completion& c, std::vector<Transfer*>& finished);
  std::string failure(const Request& r, int res) const;

  std::string dir_;
  size_t bytes_ = 0;
  DirectFileOptions opt_;
  int fd_ = -1;
  bool direct_ = false;
  struct Ring;
  std::unique_ptr<Ring> ring_;  // touched by the I/O thread only (after construction)

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Transfer> transfers_;  // submitted, not finished (stable addresses)
  std::vector<Request> requests_;  // queue_depth entries; free ones have t == nullptr
  std::vector<int> free_requests_;
  int in_flight_ = 0;
  bool stop_ = false;
  IoFaultHook fault_;
  std::thread io_;
};

// The disk under a directory as the tier uses it, in bytes per second: sequential writes (of
// blocks already allocated: a pass over the file converts its reserved blocks first), sequential
// reads, and both at once (half the bytes written to one file while the other half is read from
// a second, each on its own ring; mixed counts reads plus writes).
struct DiskRates {
  double read = 0, write = 0, mixed = 0;
  bool direct = false;  // measured with O_DIRECT (else through the page cache, dropped in between)
};
// Scratch DirectFiles of `bytes` and bytes / 2 (bytes a multiple of 32 MiB) in dir, with opt's
// requests; ~5.5 x bytes of transfers. Throws Error like DirectFile.
DiskRates measure_disk_rates(const std::string& dir, size_t bytes, const DirectFileOptions& opt = {});

// The filesystem's name under dir ("ext4", "tmpfs", ...; "fs 0x<magic>" when unknown).
std::string filesystem_name(const std::string& dir);

}  // namespace sf
