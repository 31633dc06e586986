// The TCP bootstrap (contract in tcp_bootstrap.h). Every socket is non-blocking and every wait
// is a poll() bounded by the call's deadline, so nothing here can hang past its timeout.
#include "dist/tcp_bootstrap.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "core/error.h"

namespace sf::dist {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x31424653;  // the bytes "SFB1"
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 16, kReplyHeaderBytes = 12;
enum : uint32_t { kStatusOk = 0, kStatusRefused = 1 };

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

void put_u32(std::vector<std::byte>& out, uint32_t x) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte((x >> (8 * i)) & 0xff));
}
uint32_t get_u32(const std::byte* p) {
  uint32_t x = 0;
  for (int i = 0; i < 4; ++i) x |= uint32_t(p[i]) << (8 * i);
  return x;
}

std::string endpoint(const std::string& addr, int port) {
  return cat(addr.empty() ? "*" : addr, ":", port);
}

struct FreeAddrinfo {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using Addresses = std::unique_ptr<addrinfo, FreeAddrinfo>;

// addr "" with passive: every interface.
Addresses resolve(const std::string& addr, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(addr.empty() ? nullptr : addr.c_str(), service.c_str(), &hints, &res);
  SF_REQUIRE(rc == 0 && res != nullptr, "MASTER_ADDR '", addr, "' does not resolve (", gai_strerror(rc),
             "): set MASTER_ADDR to rank 0's host name or IP address");
  return Addresses(res);
}

enum class Io { ok, closed, timed_out };

Io wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return (p.revents & (POLLERR | POLLNVAL)) ? Io::closed : Io::ok;
    if (rc == 0) return Io::timed_out;
    if (errno != EINTR) return Io::closed;
  }
}

Io send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t k = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      done += static_cast<size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (const Io w = wait_for(fd, POLLOUT, deadline); w != Io::ok) return w;
    } else {
      return Io::closed;
    }
  }
  return Io::ok;
}

Io recv_all(int fd, std::span<std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t k = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (k > 0) {
      done += static_cast<size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (const Io w = wait_for(fd, POLLIN, deadline); w != Io::ok) return w;
    } else {
      return Io::closed;
    }
  }
  return Io::ok;
}

std::vector<std::byte> reply(uint32_t status, std::span<const std::byte> body) {
  std::vector<std::byte> out;
  put_u32(out, kMagic);
  put_u32(out, status);
  put_u32(out, static_cast<uint32_t>(body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

std::vector<std::byte> refusal(const std::string& why) {
  const auto* p = reinterpret_cast<const std::byte*>(why.data());
  return reply(kStatusRefused, std::span<const std::byte>(p, std::min(why.size(), kMaxBootstrapBlob)));
}

std::string bind_error(int err, const std::string& ep) {
  if (err == EADDRINUSE)
    return cat("rank 0 cannot listen on ", ep, ": the port is already in use (another run or process "
               "listens there): pick another MASTER_PORT, or stop that process");
  if (err == EADDRNOTAVAIL)
    return cat("rank 0 cannot listen on ", ep, ": that is not an address of this host (rank 0 must "
               "run where MASTER_ADDR points): fix MASTER_ADDR or start rank 0 on that host");
  if (err == EACCES)
    return cat("rank 0 cannot listen on ", ep, ": permission denied (ports below 1024 need "
               "privileges): pick a MASTER_PORT from 1024 to 65535");
  return cat("rank 0 cannot listen on ", ep, ": ", std::strerror(err));
}

}  // namespace

BootstrapServer::BootstrapServer(const std::string& addr, int port, int world_size)
    : addr_(addr), world_(world_size) {
  SF_REQUIRE(world_size >= 1, "bootstrap: WORLD_SIZE ", world_size, " must be at least 1");
  SF_REQUIRE(port >= 0 && port <= 65535, "bootstrap: MASTER_PORT ", port, " is not a TCP port (0..65535)");
  const Addresses list = resolve(addr, port, true);
  int first_err = 0;
  for (addrinfo* a = list.get(); a != nullptr && fd_ < 0; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    const int one = 1;
    if (s.get() >= 0 && ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        ::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), std::max(world_size, 16)) == 0) {
      fd_ = s.release();
    } else if (first_err == 0) {
      first_err = errno;
    }
  }
  if (fd_ < 0) SF_FAIL(input, bind_error(first_err, endpoint(addr, port)));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  SF_CHECK(::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0, "getsockname: ", std::strerror(errno));
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

BootstrapServer::~BootstrapServer() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Rank 0's side of one serve(): connections that have not finished their hello, and the ranks.
struct Gathering {
  struct Pending {
    Fd fd;
    std::vector<std::byte> hello;
  };
  int world = 1;
  std::string ep;  // rank 0's address, for messages
  Clock::time_point deadline;
  std::vector<Pending> pending;
  std::vector<Fd> ranks;  // by rank; ranks[0] unused
  int connected = 0, strays = 0;

  // Tells every connected rank (and `also`, if any) why, then throws.
  [[noreturn]] void refuse_all(ErrorKind kind, const std::string& why, int also = -1) {
    const auto msg = refusal(why);
    const auto tell_by = std::max(deadline, Clock::now() + std::chrono::seconds(1));
    if (also >= 0) send_all(also, msg, tell_by);
    for (auto& r : ranks)
      if (r.get() >= 0) send_all(r.get(), msg, tell_by);
    throw Error(kind, why);
  }

  [[noreturn]] void refuse_missing(Timeout timeout) {
    std::string missing;
    for (int r = 1; r < world; ++r)
      if (ranks[static_cast<size_t>(r)].get() < 0) missing += cat(missing.empty() ? "" : ", ", r);
    refuse_all(ErrorKind::io,
               cat("rank ", missing, " did not connect to rank 0 at ", ep, " within ", timeout.count(), " ms (",
                   connected, " of ", world - 1, " ranks did",
                   strays ? cat("; ", strays, " other connections were not slideformer ranks") : "",
                   "): start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, check that the "
                   "hosts reach each other (firewall), or raise the timeout"));
  }

  void drop(size_t i) {
    ++strays;
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Reads what pending connection i has sent; once its hello is whole, admits it as its rank
  // (or refuses everyone), and a connection that closes or is not a rank is dropped.
  void on_readable(size_t i) {
    Pending& p = pending[i];
    std::byte buf[kHelloBytes];
    const ssize_t k = ::recv(p.fd.get(), buf, kHelloBytes - p.hello.size(), MSG_DONTWAIT);
    if (k <= 0 && !(k < 0 && (errno == EAGAIN || errno == EINTR))) return drop(i);  // closed before its hello
    if (k > 0) p.hello.insert(p.hello.end(), buf, buf + k);
    if (p.hello.size() < kHelloBytes) return;
    const std::byte* h = p.hello.data();
    if (get_u32(h) != kMagic) return drop(i);
    const uint32_t version = get_u32(h + 4), their_world = get_u32(h + 8), rank = get_u32(h + 12);
    const int fd = p.fd.get();
    if (version != kVersion)
      refuse_all(ErrorKind::input, cat("rank ", rank, " speaks bootstrap version ", version, ", rank 0 ", kVersion,
                                       ": run the same slideformer build on every rank"), fd);
    if (their_world != static_cast<uint32_t>(world))
      refuse_all(ErrorKind::input, cat("rank ", rank, " was started with WORLD_SIZE=", their_world,
                                       ", rank 0 with WORLD_SIZE=", world, ": give every rank the same WORLD_SIZE"), fd);
    if (rank < 1 || rank >= static_cast<uint32_t>(world))
      refuse_all(ErrorKind::input, cat("a process connected to ", ep, " as rank ", rank, ", outside 1..", world - 1,
                                       ": give each process its own RANK below WORLD_SIZE=", world), fd);
    if (ranks[rank].get() >= 0)
      refuse_all(ErrorKind::input, cat("rank ", rank, " connected twice (two processes have RANK=", rank,
                                       "): give each process its own RANK"), fd);
    ranks[rank] = std::move(p.fd);
    ++connected;
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  }
};

}  // namespace

void BootstrapServer::serve(std::span<const std::byte> blob, Timeout timeout) {
  SF_CHECK(blob.size() <= kMaxBootstrapBlob, "bootstrap blob of ", blob.size(), " bytes");
  if (world_ == 1) return;
  Gathering g;
  g.world = world_;
  g.ep = endpoint(addr_, port_);
  g.deadline = Clock::now() + timeout;
  g.ranks.resize(static_cast<size_t>(world_));
  while (g.connected < world_ - 1) {
    std::vector<pollfd> fds{{fd_, POLLIN, 0}};
    for (auto& p : g.pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), remaining_ms(g.deadline));
    if (rc < 0 && errno == EINTR) continue;
    SF_CHECK(rc >= 0, "bootstrap poll: ", std::strerror(errno));
    if (rc == 0) g.refuse_missing(timeout);
    // Hellos first, last to first (fds[1..] match pending as built; admitting erases), then
    // new connections.
    for (size_t i = g.pending.size(); i-- > 0;)
      if (fds[i + 1].revents & (POLLIN | POLLERR | POLLHUP)) g.on_readable(i);
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c >= 0) g.pending.push_back({Fd(c), {}});
    }
  }
  const auto msg = reply(kStatusOk, blob);
  const auto send_by = std::max(g.deadline, Clock::now() + std::chrono::seconds(1));
  for (int r = 1; r < world_; ++r)
    if (send_all(g.ranks[static_cast<size_t>(r)].get(), msg, send_by) != Io::ok)
      SF_FAIL(io, "rank ", r, " closed its bootstrap connection to ", g.ep,
              " before rank 0 sent the id: it failed; see its error");
}

namespace {

// A connected socket to rank 0, retrying while refused (rank 0 may start later).
Fd connect_to_rank0(const std::string& addr, int port, int rank, Timeout timeout, Clock::time_point deadline) {
  const Addresses list = resolve(addr, port, false);
  const std::string ep = endpoint(addr, port);
  for (;;) {
    int last_err = 0;
    for (addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
      Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (s.get() < 0) {
        last_err = errno;
        continue;
      }
      int err = ::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        const Io w = wait_for(s.get(), POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
        socklen_t len = sizeof err;
        if (w == Io::timed_out) err = ETIMEDOUT;
        else ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err == 0) return s;
      last_err = err;
    }
    const bool retry = last_err == ECONNREFUSED || last_err == ETIMEDOUT || last_err == EHOSTUNREACH ||
                       last_err == ENETUNREACH || last_err == ECONNRESET;
    if (!retry || remaining_ms(deadline) == 0) {
      if (last_err == ECONNREFUSED)
        SF_FAIL(io, "rank ", rank, " could not connect to rank 0 at ", ep, ": connection refused for ", timeout.count(),
                " ms (rank 0 is not running, or listens on another MASTER_ADDR/MASTER_PORT): start rank 0, "
                "give every rank the same MASTER_ADDR and MASTER_PORT, or raise the timeout");
      SF_FAIL(io, "rank ", rank, " could not connect to rank 0 at ", ep, ": ", std::strerror(last_err),
              " (is MASTER_ADDR reachable from this host? a firewall?)");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
  }
}

}  // namespace

std::vector<std::byte> bootstrap_receive(const std::string& addr, int port, int world_size, int rank, Timeout timeout) {
  SF_REQUIRE(world_size >= 2 && rank >= 1 && rank < world_size, "bootstrap: rank ", rank, " of WORLD_SIZE=",
             world_size, " does not receive (rank 0 serves; ranks are 1..WORLD_SIZE-1)");
  const auto deadline = Clock::now() + timeout;
  const std::string ep = endpoint(addr, port);
  Fd s = connect_to_rank0(addr, port, rank, timeout, deadline);
  std::vector<std::byte> hello;
  for (uint32_t x : {kMagic, kVersion, static_cast<uint32_t>(world_size), static_cast<uint32_t>(rank)}) put_u32(hello, x);
  std::byte head[kReplyHeaderBytes];
  Io io = send_all(s.get(), hello, deadline);
  if (io == Io::ok) io = recv_all(s.get(), head, deadline);
  if (io == Io::timed_out)
    SF_FAIL(io, "rank ", rank, ": rank 0 at ", ep, " accepted the connection but sent no reply within ", timeout.count(),
            " ms: another rank may be missing (rank 0's error names it) or rank 0 hangs; raise the timeout if "
            "the ranks start far apart");
  SF_REQUIRE(io == Io::ok, "rank ", rank, ": rank 0 at ", ep, " closed the connection before replying: it failed (see its error)");
  SF_REQUIRE(get_u32(head) == kMagic, "rank ", rank, ": what answers at ", ep, " is not slideformer's rank 0: "
             "check MASTER_ADDR and MASTER_PORT");
  const uint32_t status = get_u32(head + 4), len = get_u32(head + 8);
  SF_REQUIRE(len <= kMaxBootstrapBlob, "rank ", rank, ": rank 0 at ", ep, " announced ", len, " bytes (limit ",
             kMaxBootstrapBlob, "): not slideformer's rank 0, or another version");
  std::vector<std::byte> body(len);
  io = recv_all(s.get(), body, deadline);
  SF_REQUIRE(io == Io::ok, "rank ", rank, ": rank 0 at ", ep, " stopped mid-reply: it failed (see its error)");
  if (status != kStatusOk)
    SF_FAIL(io, "rank ", rank, ": rank 0 refused the bootstrap: ",
            std::string(reinterpret_cast<const char*>(body.data()), body.size()));
  return body;
}

std::vector<std::byte> tcp_bootstrap(const LaunchEnv& env, std::span<const std::byte> blob, Timeout timeout) {
  if (env.world_size == 1) return {blob.begin(), blob.end()};
  if (env.rank != 0) return bootstrap_receive(env.master_addr, env.master_port, env.world_size, env.rank, timeout);
  // Every interface: a host name may resolve to a loopback alias here (Debian's 127.0.1.1 in
  // /etc/hosts) that the other hosts cannot reach; they connect to MASTER_ADDR.
  BootstrapServer server("", env.master_port, env.world_size);
  server.serve(blob, timeout);
  return {blob.begin(), blob.end()};
}

}  // namespace sf::dist
