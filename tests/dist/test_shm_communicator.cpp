// ShmCommunicator: the collectives over a shared-memory region give, rank for rank, the bits of
// ThreadCommunicator (the serial sum in rank order), whole or in pieces (a region of a few
// bytes per rank forces every call into many), uneven and empty shards included; an abort, a
// missing rank (the timeout) and a mismatched call stop every rank with an Error naming the
// rank. Ranks are threads here, each with its own mapping of the region (opened by name, as a
// process would); the CLI tests run it across processes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>

#include "dist/dist_test_util.h"
#include "dist/shm_communicator.h"
#include "dist/thread_communicator.h"

namespace sf::dist {
namespace {

// The region made by "rank 0" and every rank's communicator over its own mapping.
struct ShmGroup {
  std::vector<std::unique_ptr<ShmCommunicator>> comms;
  ShmGroup(int world, size_t capacity, Timeout timeout) {
    const std::string name = shared_region_name(new_run_id(), "comm-test");
    SharedRegion created = SharedRegion::create(name, ShmCommunicator::region_bytes(world, capacity));
    ShmCommunicator::init(created.data(), world, capacity);
    for (int r = 1; r < world; ++r)
      comms.push_back(std::make_unique<ShmCommunicator>(
          SharedRegion::open(name, ShmCommunicator::region_bytes(world, capacity)), r, world, timeout));
    comms.insert(comms.begin(), std::make_unique<ShmCommunicator>(std::move(created), 0, world, timeout));
    comms[0]->unlink();
  }
};

// Every collective on both communicators, the outputs compared bit for bit.
void same_as_threads(int world, size_t n, size_t capacity) {
  SCOPED_TRACE(testing::Message() << world << " ranks, " << n << " elements, capacity " << capacity);
  ShmGroup shm(world, capacity, Timeout(60000));
  auto group = std::make_shared<ThreadGroup>(world, Timeout(60000));
  struct Out {
    std::vector<float> ar, rs, ag;
    std::vector<double> ard;
    std::vector<std::byte> bc;
  };
  auto run = [&](Communicator& c, Out& o) {
    const int r = c.rank();
    o.ar = test::spread_values<float>(n, 10 + uint32_t(r));
    c.all_reduce_sum(std::span<float>(o.ar));
    o.ard = test::spread_values<double>(n, 20 + uint32_t(r));
    c.all_reduce_sum(std::span<double>(o.ard));
    const std::vector<float> send = test::spread_values<float>(n, 30 + uint32_t(r));
    o.rs.assign(shard_range(n, world, r).size(), 0.f);
    c.reduce_scatter_sum(send, o.rs);
    const std::vector<float> mine = test::spread_values<float>(shard_range(n, world, r).size(), 40 + uint32_t(r));
    o.ag.assign(n, 0.f);
    c.all_gather(mine, o.ag);
    o.bc.assign(n + 3, std::byte(r));
    c.broadcast(o.bc, world - 1);
    c.barrier();
  };
  std::vector<Out> a(static_cast<size_t>(world)), b(static_cast<size_t>(world));
  auto ea = test::run_ranks(world, [&](int r) { run(*shm.comms[size_t(r)], a[size_t(r)]); });
  auto eb = test::run_ranks(world, [&](int r) {
    ThreadCommunicator c(group, r);
    run(c, b[size_t(r)]);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(ea[size_t(r)], "") << "rank " << r;
    ASSERT_EQ(eb[size_t(r)], "") << "rank " << r;
    const Out &x = a[size_t(r)], &y = b[size_t(r)];
    EXPECT_EQ(std::memcmp(x.ar.data(), y.ar.data(), n * 4), 0) << "all_reduce f32, rank " << r;
    EXPECT_EQ(std::memcmp(x.ard.data(), y.ard.data(), n * 8), 0) << "all_reduce f64, rank " << r;
    EXPECT_EQ(std::memcmp(x.rs.data(), y.rs.data(), x.rs.size() * 4), 0) << "reduce_scatter, rank " << r;
    EXPECT_EQ(std::memcmp(x.ag.data(), y.ag.data(), n * 4), 0) << "all_gather, rank " << r;
    EXPECT_EQ(x.bc, y.bc) << "broadcast, rank " << r;
    EXPECT_EQ(x.bc[0], std::byte(world - 1)) << "broadcast from the last rank";
  }
}

TEST(ShmCommunicator, GivesTheThreadCommunicatorsBitsWholeAndInPieces) {
  for (int world : {1, 2, 3})
    for (size_t n : {size_t(0), size_t(5), size_t(1000 + 37)}) {
      same_as_threads(world, n, 64);           // many pieces (16 floats per rank and call)
      same_as_threads(world, n, size_t(1) << 16);  // one piece
    }
}

TEST(ShmCommunicator, AnAbortStopsEveryRankNamingIt) {
  ShmGroup g(3, 4096, Timeout(60000));
  auto errors = test::run_ranks(3, [&](int r) {
    if (r == 1) g.comms[1]->abort("its data was bad");
    else g.comms[size_t(r)]->barrier();
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("rank 1 aborted the group: its data was bad"), std::string::npos)
        << errors[size_t(r)];
  }
  // Later calls fail at once too.
  EXPECT_THROW(g.comms[0]->barrier(), Error);
}

TEST(ShmCommunicator, AMissingRankIsNamedAfterTheTimeout) {
  ShmGroup g(3, 4096, Timeout(300));
  auto errors = test::run_ranks(3, [&](int r) {
    if (r != 2) g.comms[size_t(r)]->barrier();
  });
  for (int r : {0, 1}) EXPECT_NE(errors[size_t(r)].find("rank(s) 2 did not arrive"), std::string::npos) << errors[size_t(r)];
}

TEST(ShmCommunicator, AMismatchedCallFailsOnEveryRank) {
  ShmGroup g(2, 4096, Timeout(60000));
  auto errors = test::run_ranks(2, [&](int r) {
    std::vector<float> x(size_t(10 + r), 1.f);
    g.comms[size_t(r)]->all_reduce_sum(std::span<float>(x));
  });
  for (int r : {0, 1}) EXPECT_NE(errors[size_t(r)].find("same collectives"), std::string::npos) << errors[size_t(r)];
}

}  // namespace
}  // namespace sf::dist
