// ProfilingBackend forwards every op unchanged and counts the ops per key.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/profiling_backend.h"
#include "host_test_util.h"

namespace sf::test {
namespace {

TEST(ProfilingBackend, ForwardsOpsAndCountsThemPerKey) {
  HostBackend host;
  ProfilingBackend pb(host);
  Stream& s = pb.default_stream();
  const HMat a = HMat::random(6, 5, 1), b = HMat::random(5, 4, 2), w = HMat::random(1, 4, 3, -1, 0.5f, 1.5f);
  HMat direct(6, 4), profiled(6, 4), nd(6, 4), np(6, 4);
  std::vector<float> rd(6), rp(6);
  auto m = [](const HMat& x) { return Mat(const_cast<float*>(x.buf.data()), DType::f32, x.rows, x.cols, x.ld); };
  host.gemm(s, m(direct), m(a), Trans::no, m(b), Trans::no, 1.f, 0.f);
  host.rmsnorm_forward(s, m(nd), rd.data(), m(direct), m(w), 1e-5f);
  for (int i = 0; i < 2; ++i) pb.gemm(s, m(profiled), m(a), Trans::no, m(b), Trans::no, 1.f, 0.f);
  pb.rmsnorm_forward(s, m(np), rp.data(), m(profiled), m(w), 1e-5f);
  EXPECT_EQ(direct.buf, profiled.buf);
  EXPECT_EQ(nd.buf, np.buf);
  EXPECT_EQ(rd, rp);

  const auto lines = pb.take();
  ASSERT_EQ(lines.size(), 2u);
  auto find = [&](const std::string& key) {
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.op == key; });
    return it == lines.end() ? -1 : it->calls;
  };
  EXPECT_EQ(find("gemm 6x4x5"), 2);  // M x N x K
  EXPECT_EQ(find("rmsnorm_forward 6x4"), 1);
  EXPECT_TRUE(pb.take().empty());  // take() clears
}

}  // namespace
}  // namespace sf::test
