// The TCP bootstrap between threads on 127.0.0.1 (ephemeral ports): every rank gets rank 0's
// blob; each failure (refused, address in use or not ours, a rank missing, a mismatched world,
// a duplicate rank, no reply) is an Error naming it, within the timeout, never a hang.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <chrono>
#include <latch>
#include <memory>
#include <thread>

#include "dist/dist_test_util.h"
#include "dist/tcp_bootstrap.h"

namespace sf::dist {
namespace {

using test::run_ranks;
using test::message_of;

const std::string kLocal = "127.0.0.1";
// Generous for the paths that succeed (CI shares 2 cores); the failure cases wait out shorter
// ones on purpose.
constexpr Timeout kLong{30000};
constexpr Timeout kShort{700};

std::vector<std::byte> id_blob(size_t n) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = std::byte(static_cast<unsigned>(i * 37 + 11));
  return b;
}

// A port nothing listens on: one the kernel just handed out, released again.
int free_port() {
  BootstrapServer s(kLocal, 0, 2);
  return s.port();
}

TEST(TcpBootstrap, EveryRankReceivesRankZerosBlob) {
  for (int world : {2, 4}) {
    BootstrapServer server(kLocal, 0, world);
    ASSERT_GT(server.port(), 0);
    const auto blob = id_blob(128);  // an NCCL unique id's size
    std::vector<std::vector<std::byte>> got(static_cast<size_t>(world));
    const auto errors = run_ranks(world, [&](int r) {
      if (r == 0) server.serve(blob, kLong);
      else got[static_cast<size_t>(r)] = bootstrap_receive(kLocal, server.port(), world, r, kLong);
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    for (int r = 1; r < world; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], blob) << "rank " << r;
  }
}

TEST(TcpBootstrap, AnEmptyAndALargeBlobArriveWhole) {
  for (size_t n : {size_t(0), kMaxBootstrapBlob}) {
    BootstrapServer server(kLocal, 0, 2);
    const auto blob = id_blob(n);
    std::vector<std::byte> got{std::byte(1)};
    const auto errors = run_ranks(2, [&](int r) {
      if (r == 0) server.serve(blob, kLong);
      else got = bootstrap_receive(kLocal, server.port(), 2, 1, kLong);
    });
    EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
    EXPECT_EQ(got, blob) << n << " bytes";
  }
}

TEST(TcpBootstrap, ARankRetriesUntilRankZeroListens) {
  const int port = free_port();
  std::vector<std::byte> got;
  std::thread late_client([&] { got = bootstrap_receive(kLocal, port, 2, 1, kLong); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the client meets refusals first
  std::string server_error = message_of([&] {
    BootstrapServer server(kLocal, port, 2);
    server.serve(id_blob(16), kLong);
  });
  late_client.join();
  EXPECT_EQ(server_error, "");
  EXPECT_EQ(got, id_blob(16));
}

TEST(TcpBootstrap, RefusedUntilTheTimeoutNamesRankZerosAddress) {
  const int port = free_port();
  const std::string m = message_of([&] { bootstrap_receive(kLocal, port, 3, 2, kShort); });
  EXPECT_NE(m.find("rank 2 could not connect to rank 0 at 127.0.0.1:" + std::to_string(port) + ": connection refused"),
            std::string::npos) << m;
  EXPECT_NE(m.find("start rank 0"), std::string::npos) << m;
}

TEST(TcpBootstrap, APortInUseIsRefusedAtOnce) {
  BootstrapServer first(kLocal, 0, 2);
  const std::string m = message_of([&] { BootstrapServer second(kLocal, first.port(), 2); });
  EXPECT_NE(m.find("already in use"), std::string::npos) << m;
  EXPECT_NE(m.find("pick another MASTER_PORT"), std::string::npos) << m;
}

TEST(TcpBootstrap, AnAddressOfAnotherHostIsRefused) {
  // 192.0.2.1: TEST-NET-1 (RFC 5737), never an address of this machine; numeric, so no DNS.
  const std::string m = message_of([&] { BootstrapServer s("192.0.2.1", 0, 2); });
  EXPECT_NE(m.find("not an address of this host"), std::string::npos) << m;
}

TEST(TcpBootstrap, AMissingRankIsNamedByRankZeroAndToldToTheOthers) {
  const int world = 4;
  BootstrapServer server(kLocal, 0, world);  // listening: a connect lands in its backlog at once
  // The serving rank's (waited-out) timeout starts once the present ranks are about to connect,
  // so that only rank 2 can be missing however late the box schedules their threads.
  std::latch present(world - 1);
  const auto errors = run_ranks(world, [&](int r) {
    if (r == 2) return;  // never starts
    present.arrive_and_wait();
    if (r == 0) server.serve(id_blob(8), Timeout(2000));
    else bootstrap_receive(kLocal, server.port(), world, r, kLong);
  });
  for (int r : {0, 1, 3}) {
    const auto& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("rank 2 did not connect to rank 0 at 127.0.0.1:"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("(2 of 3 ranks did"), std::string::npos) << e;
  }
  EXPECT_NE(errors[1].find("rank 1: rank 0 refused the bootstrap"), std::string::npos) << errors[1];
}

TEST(TcpBootstrap, AWorldSizeMismatchFailsBothSides) {
  BootstrapServer server(kLocal, 0, 3);
  const auto errors = run_ranks(2, [&](int r) {
    if (r == 0) server.serve(id_blob(8), kLong);
    else bootstrap_receive(kLocal, server.port(), 2, 1, kLong);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 1 was started with WORLD_SIZE=2, rank 0 with WORLD_SIZE=3"), std::string::npos) << e;
  }
}

TEST(TcpBootstrap, TwoProcessesWithOneRankFailEveryone) {
  BootstrapServer server(kLocal, 0, 3);
  // Threads 1 and 2 both claim rank 1.
  const auto errors = run_ranks(3, [&](int r) {
    if (r == 0) server.serve(id_blob(8), kLong);
    else bootstrap_receive(kLocal, server.port(), 3, 1, kLong);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1 connected twice"), std::string::npos) << e;
}

TEST(TcpBootstrap, AStrayConnectionIsIgnored) {
  BootstrapServer server(kLocal, 0, 2);
  // Something that is not a rank connects first, writes garbage and stays open.
  const int stray = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(stray, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server.port()));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(::connect(stray, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const char junk[16] = "GET / HTTP/1.0\n";
  ASSERT_EQ(::send(stray, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
  std::vector<std::byte> got;
  const auto errors = run_ranks(2, [&](int r) {
    if (r == 0) server.serve(id_blob(32), kLong);
    else got = bootstrap_receive(kLocal, server.port(), 2, 1, kLong);
  });
  ::close(stray);
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(got, id_blob(32));
}

TEST(TcpBootstrap, NoReplyWithinTheTimeoutIsAnError) {
  BootstrapServer server(kLocal, 0, 2);  // listens (the kernel accepts) but never serves
  const std::string m = message_of([&] { bootstrap_receive(kLocal, server.port(), 2, 1, kShort); });
  EXPECT_NE(m.find("accepted the connection but sent no reply within 700 ms"), std::string::npos) << m;
}

TEST(TcpBootstrap, FromTheLaunchEnvironment) {
  const int port = free_port();
  const int world = 3;
  std::vector<std::vector<std::byte>> got(world);
  const auto errors = run_ranks(world, [&](int r) {
    LaunchEnv env{world, r, r, kLocal, port, true};
    got[static_cast<size_t>(r)] = tcp_bootstrap(env, r == 0 ? id_blob(128) : std::vector<std::byte>{}, kLong);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(got[static_cast<size_t>(r)], id_blob(128)) << "rank " << r;
  }
  EXPECT_EQ(tcp_bootstrap(LaunchEnv{}, id_blob(5), kShort), id_blob(5)) << "world 1: no socket";
}

TEST(TcpBootstrap, RefusesBadArguments) {
  EXPECT_THROW(bootstrap_receive(kLocal, 1, 2, 0, kShort), Error) << "rank 0 serves";
  EXPECT_THROW(bootstrap_receive(kLocal, 1, 2, 2, kShort), Error) << "rank outside the world";
  EXPECT_THROW(BootstrapServer(kLocal, 70000, 2), Error);
  EXPECT_THROW(BootstrapServer(kLocal, 0, 0), Error);
}

}  // namespace
}  // namespace sf::dist
