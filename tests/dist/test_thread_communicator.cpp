// ThreadCommunicator: every collective against a serial sum in rank order, bit for bit;
// uneven shards; timeouts, mismatches and aborts that stop every rank with an Error naming
// the culprit instead of a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <cstring>
#include <memory>
#include <thread>

#include "dist/dist_test_util.h"
#include "dist/thread_communicator.h"

namespace sf::dist {
namespace {

using test::run_ranks;
using test::spread_values;

// Generous: a correct collective on a loaded 2-core CI box finishes in milliseconds; only the
// timeout tests wait their (shorter) timeout out on purpose.
constexpr Timeout kNoTimeout{60000};

template <class T>
std::vector<std::vector<T>> inputs(int world, size_t n, uint32_t seed) {
  std::vector<std::vector<T>> in;
  for (int r = 0; r < world; ++r) in.push_back(spread_values<T>(n, seed + 977u * static_cast<uint32_t>(r)));
  return in;
}

// The reference: rank 0 + rank 1 + ... left to right (reversed: the other order).
template <class T>
std::vector<T> serial_sum(const std::vector<std::vector<T>>& in, bool reversed = false) {
  std::vector<T> s(in[0].size());
  for (size_t i = 0; i < s.size(); ++i) {
    T acc = reversed ? in.back()[i] : in[0][i];
    for (size_t k = 1; k < in.size(); ++k) acc += reversed ? in[in.size() - 1 - k][i] : in[k][i];
    s[i] = acc;
  }
  return s;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
void check_all_reduce(int world, size_t n) {
  SCOPED_TRACE(testing::Message() << "world " << world << ", " << n << " elements, " << sizeof(T) * 8 << "-bit");
  const auto in = inputs<T>(world, n, 11u * static_cast<uint32_t>(world) + static_cast<uint32_t>(n));
  const auto want = serial_sum(in);
  if (world >= 3 && n >= 100) {  // the inputs can tell the orders apart (else the test could not fail)
    EXPECT_FALSE(same_bits(want, serial_sum(in, true)));
  }
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  std::vector<std::vector<T>> out = in;
  const auto errors = run_ranks(world, [&](int r) {
    ThreadCommunicator comm(group, r);
    comm.all_reduce_sum(std::span<T>(out[static_cast<size_t>(r)]));
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_TRUE(same_bits(out[static_cast<size_t>(r)], want)) << "rank " << r;
  }
}

TEST(ThreadCommunicator, AllReduceEqualsTheSerialSumInRankOrderBitwise) {
  for (int world : {1, 2, 3, 5})
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
      check_all_reduce<float>(world, n);
      check_all_reduce<double>(world, n);
    }
}

TEST(ShardRange, CutsEvenlyInRankOrderWithTheRemainderLast) {
  auto sizes = [](size_t n, int world, size_t align) {
    std::vector<size_t> s;
    size_t next = 0;
    for (int r = 0; r < world; ++r) {
      const ShardRange x = shard_range(n, world, r, align);
      EXPECT_EQ(x.begin, next) << "contiguous, in rank order";
      next = x.end;
      s.push_back(x.size());
    }
    EXPECT_EQ(next, n) << "the shards cover every element";
    return s;
  };
  EXPECT_EQ(sizes(10, 4, 1), (std::vector<size_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(5, 4, 1), (std::vector<size_t>{2, 2, 1, 0}));
  EXPECT_EQ(sizes(0, 3, 1), (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(sizes(8, 2, 1), (std::vector<size_t>{4, 4}));
  EXPECT_EQ(sizes(200, 3, 64), (std::vector<size_t>{128, 72, 0}));
  EXPECT_EQ(sizes(1000, 4, 64), (std::vector<size_t>{256, 256, 256, 232}));
  EXPECT_EQ(shard_range(1000, 4, 1, 64).begin % 64, 0u) << "aligned starts";
}

TEST(ThreadCommunicator, ReduceScatterGivesEachRankItsShardOfTheSerialSum) {
  for (int world : {1, 2, 3, 4})
    for (size_t n : {size_t(0), size_t(1), size_t(5), size_t(13), size_t(1001)}) {
      SCOPED_TRACE(testing::Message() << "world " << world << ", " << n << " elements");
      const auto in = inputs<float>(world, n, 5u + static_cast<uint32_t>(n));
      const auto want = serial_sum(in);
      auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
      std::vector<std::vector<float>> out(static_cast<size_t>(world));
      const auto errors = run_ranks(world, [&](int r) {
        ThreadCommunicator comm(group, r);
        auto& mine = out[static_cast<size_t>(r)];
        mine.assign(shard_range(n, world, r).size(), -7.0f);  // poison: every element overwritten
        comm.reduce_scatter_sum(in[static_cast<size_t>(r)], mine);
      });
      std::vector<float> joined;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[static_cast<size_t>(r)], "");
        joined.insert(joined.end(), out[static_cast<size_t>(r)].begin(), out[static_cast<size_t>(r)].end());
      }
      EXPECT_TRUE(same_bits(joined, want));
    }
}

TEST(ThreadCommunicator, AllGatherAssemblesTheShardsInRankOrder) {
  for (int world : {1, 2, 3, 4})
    for (size_t n : {size_t(0), size_t(2), size_t(7), size_t(1001)}) {
      SCOPED_TRACE(testing::Message() << "world " << world << ", " << n << " elements");
      const auto want = spread_values<float>(n, 3u + static_cast<uint32_t>(n));
      auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
      std::vector<std::vector<float>> out(static_cast<size_t>(world), std::vector<float>(n, -7.0f));
      const auto errors = run_ranks(world, [&](int r) {
        ThreadCommunicator comm(group, r);
        const ShardRange s = shard_range(n, world, r);
        const std::vector<float> mine(want.begin() + static_cast<std::ptrdiff_t>(s.begin),
                                      want.begin() + static_cast<std::ptrdiff_t>(s.end));
        comm.all_gather(mine, out[static_cast<size_t>(r)]);
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[static_cast<size_t>(r)], "");
        EXPECT_TRUE(same_bits(out[static_cast<size_t>(r)], want)) << "rank " << r;
      }
    }
}

TEST(ThreadCommunicator, BroadcastCopiesTheRootsBytesToEveryRank) {
  const int world = 3;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  std::vector<std::vector<std::byte>> data(world, std::vector<std::byte>(129));
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < 129; ++i) data[static_cast<size_t>(r)][i] = std::byte(static_cast<unsigned>(r * 31 + i * 7));
  const auto want = data[1];
  const auto errors = run_ranks(world, [&](int r) {
    ThreadCommunicator(group, r).broadcast(data[static_cast<size_t>(r)], 1);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(data[static_cast<size_t>(r)], want) << "rank " << r;
  }
}

TEST(ThreadCommunicator, BarrierHoldsEveryRankUntilTheLastArrives) {
  const int world = 4;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  std::atomic<int> before{0};
  std::vector<int> seen(world, -1);
  const auto errors = run_ranks(world, [&](int r) {
    ThreadCommunicator comm(group, r);
    // The last rank comes late, so a barrier that let anyone through early would be seen.
    if (r == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    before.fetch_add(1);
    comm.barrier();
    seen[static_cast<size_t>(r)] = before.load();
    comm.barrier();  // a second round on the same group
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(seen[static_cast<size_t>(r)], world) << "rank " << r << " left the barrier early";
  }
}

TEST(ThreadCommunicator, ManyCallsInSequenceKeepTheirOrder) {
  const int world = 3;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  std::vector<double> totals(world);
  const auto errors = run_ranks(world, [&](int r) {
    ThreadCommunicator comm(group, r);
    double total = 0;
    for (int k = 0; k < 200; ++k) {
      double x = (r + 1) * 1000.0 + k;  // exact in double: the sum is 6000 + 3k
      comm.all_reduce_sum(std::span<double>(&x, 1));
      total += x;
      if (k % 50 == 0) comm.barrier();
    }
    totals[static_cast<size_t>(r)] = total;
  });
  const double want = 200 * 6000.0 + 3.0 * (199 * 200 / 2);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(totals[static_cast<size_t>(r)], want);
  }
}

TEST(ThreadCommunicator, ARankThatNeverArrivesIsNamedByEveryWaiterAfterTheTimeout) {
  const int world = 3;
  // Waited out, so short; the ranks that do come meet at a latch first, so that only rank 1 can
  // be missing however late the box schedules the others' threads.
  auto group = std::make_shared<ThreadGroup>(world, Timeout(2000));
  std::vector<std::string> later(world);
  std::latch present(world - 1);
  const auto errors = run_ranks(world, [&](int r) {
    if (r == 1) return;  // hangs or died: never calls
    ThreadCommunicator comm(group, r);
    present.arrive_and_wait();
    try {
      std::vector<float> x(10, 1.0f);
      comm.all_reduce_sum(x);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::io);
      try {
        comm.barrier();  // the group is broken: throws at once, not after another timeout
      } catch (const Error& e2) {
        later[static_cast<size_t>(r)] = e2.what();
      }
      throw;
    }
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 1 did not arrive at all_reduce_sum(f32)"), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_NE(later[static_cast<size_t>(r)].find("broken group"), std::string::npos) << later[static_cast<size_t>(r)];
  }
  EXPECT_EQ(errors[1], "");
}

TEST(ThreadCommunicator, RanksThatDisagreeOnACallAllFailNamingBoth) {
  const int world = 2;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  const auto errors = run_ranks(world, [&](int r) {
    std::vector<float> x(r == 0 ? 5 : 4, 1.0f);
    ThreadCommunicator(group, r).all_reduce_sum(x);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("ranks disagree"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1 called all_reduce_sum(f32) with 4 elements"), std::string::npos) << e;
  }
}

TEST(ThreadCommunicator, AbortStopsTheOtherRanksWithoutWaitingForTheTimeout) {
  const int world = 3;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);  // a missed abort would wait 60 s, then fail
  const auto errors = run_ranks(world, [&](int r) {
    ThreadCommunicator comm(group, r);
    if (r == 2) {
      comm.abort("out of memory loading layer 3");
      return;
    }
    comm.barrier();
  });
  for (int r : {0, 1})
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2 aborted the group: out of memory loading layer 3"),
              std::string::npos) << errors[static_cast<size_t>(r)];
}

TEST(ThreadCommunicator, AWrongShardSizeFailsThatRankAndReleasesTheOthers) {
  const int world = 2;
  auto group = std::make_shared<ThreadGroup>(world, kNoTimeout);
  const std::vector<float> send(10, 1.0f);
  const auto errors = run_ranks(world, [&](int r) {
    std::vector<float> recv(r == 1 ? 4 : 5);  // rank 1's shard of 10 is 5
    ThreadCommunicator(group, r).reduce_scatter_sum(send, recv);
  });
  EXPECT_NE(errors[1].find("recv holds 4 elements, this rank's shard of 10 is 5"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1 aborted the group"), std::string::npos) << errors[0];
}

TEST(ThreadCommunicator, RefusesABadGroupOrRank) {
  EXPECT_THROW(ThreadGroup(0, kNoTimeout), Error);
  EXPECT_THROW(ThreadGroup(2, Timeout(0)), Error);
  auto group = std::make_shared<ThreadGroup>(2, kNoTimeout);
  EXPECT_THROW(ThreadCommunicator(group, 2), Error);
  EXPECT_THROW(ThreadCommunicator(group, -1), Error);
}

}  // namespace
}  // namespace sf::dist
