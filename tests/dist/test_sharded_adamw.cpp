// The design's update, at the optimizer level (docs/MULTI_GPU.md, "The CPU AdamW, sharded" and
// "Exact clipping"): N ranks reduce-scatter their gradients (ThreadCommunicator), each sums
// the squares of its shard in double, one f64 all-reduce gives the global sum, every rank asks
// decide_clip, and each updates ITS slice of ONE shared master + moments with the host AdamW.
// The result must be bitwise the single rank's: AdamW over the serial sum of the gradients
// (rank 0 + rank 1 + ...), with the norm's partial sums added in the same shard order. Both
// the clipping and the non-clipping branch; shards of 64-element alignment, uneven and empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "dist/dist_test_util.h"
#include "dist/thread_communicator.h"
#include "engine/clip_decision.h"
#include "optim/adamw.h"

namespace sf::dist {
namespace {

constexpr size_t kAlign = 64;  // the CPU AdamW's slices (docs/MULTI_GPU.md)

struct State {
  std::vector<float> p, m, v;
  std::vector<uint16_t> bf16;
};

State initial(size_t n) {
  State s{test::spread_values<float>(n, 1), test::spread_values<float>(n, 2), test::spread_values<float>(n, 3),
          std::vector<uint16_t>(n, 0)};
  for (auto& x : s.v) x = x * x;  // second moments are non-negative
  return s;
}

// sum over shards (rank order) of the shard's squares in double, element order within.
double sumsq_by_shard(const std::vector<float>& g, int world) {
  double total = 0;
  for (int r = 0; r < world; ++r) {
    const ShardRange s = shard_range(g.size(), world, r, kAlign);
    double part = 0;
    for (size_t i = s.begin; i < s.end; ++i) part += double(g[i]) * double(g[i]);
    total += part;
  }
  return total;
}

AdamWStep step_with(float coef) {
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.01f;
  s.step = 3;
  s.grad_scale = coef;
  return s;
}

void check(int world, size_t n, float max_grad_norm) {
  SCOPED_TRACE(testing::Message() << world << " ranks, " << n << " parameters, max_grad_norm " << max_grad_norm);
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < world; ++r) grads.push_back(test::spread_values<float>(n, 100 + uint32_t(r)));

  // One rank with every rank's batch: the serial sum, then one AdamW over all of it.
  std::vector<float> g = grads[0];
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < n; ++i) g[i] += grads[size_t(r)][i];
  const ClipDecision want_clip = decide_clip(sumsq_by_shard(g, world), max_grad_norm);
  State want = initial(n);
  adamw_update(want.p.data(), want.m.data(), want.v.data(), g.data(), want.bf16.data(), int64_t(n),
               step_with(want_clip.coef), nullptr);

  // N ranks, one shared state, each updating its slice.
  State shared = initial(n);
  std::vector<float> coefs(static_cast<size_t>(world));
  auto group = std::make_shared<ThreadGroup>(world, Timeout(60000));
  const auto errors = test::run_ranks(world, [&](int r) {
    ThreadCommunicator comm(group, r);
    // As the engine will: the gradient padded (zeros) to world equal 64-aligned shards, so the
    // reduce-scatter's shard r is the AdamW slice r (shard_range with align 64) plus pad.
    const size_t shard = (n + size_t(world) - 1) / size_t(world);
    const size_t padded_shard = (shard + kAlign - 1) / kAlign * kAlign;
    std::vector<float> padded(size_t(world) * padded_shard, 0.0f);
    std::copy(grads[size_t(r)].begin(), grads[size_t(r)].end(), padded.begin());
    std::vector<float> mine(padded_shard);
    comm.reduce_scatter_sum(padded, mine);
    const ShardRange s = shard_range(n, world, r, kAlign);
    EXPECT_EQ(s.begin, std::min(n, size_t(r) * padded_shard));
    double part = 0;
    for (size_t i = 0; i < s.size(); ++i) part += double(mine[i]) * double(mine[i]);
    std::vector<double> parts(size_t(world), 0.0);
    parts[size_t(r)] = part;
    comm.all_reduce_sum(std::span<double>(parts));  // each rank's partial, in its own slot
    double total = 0;
    for (double x : parts) total += x;  // rank order, as sumsq_by_shard adds them
    const ClipDecision d = decide_clip(total, max_grad_norm);
    coefs[size_t(r)] = d.coef;
    if (s.size() > 0)
      adamw_update(shared.p.data() + s.begin, shared.m.data() + s.begin, shared.v.data() + s.begin,
                   mine.data(), shared.bf16.data() + s.begin, int64_t(s.size()), step_with(d.coef),
                   nullptr);
    comm.barrier();  // every slice updated: the shared weights are whole
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(coefs[size_t(r)], want_clip.coef) << "rank " << r << " decided another clip";
  }
  EXPECT_EQ(max_grad_norm > 0 && want_clip.coef < 1.0f, max_grad_norm > 0) << "the clipping case clips";
  EXPECT_EQ(std::memcmp(shared.p.data(), want.p.data(), n * 4), 0) << "master";
  EXPECT_EQ(std::memcmp(shared.m.data(), want.m.data(), n * 4), 0) << "m";
  EXPECT_EQ(std::memcmp(shared.v.data(), want.v.data(), n * 4), 0) << "v";
  EXPECT_EQ(std::memcmp(shared.bf16.data(), want.bf16.data(), n * 2), 0) << "bf16 weights";
}

TEST(ShardedAdamW, EqualsOneRankOverTheWholeBatchBitwise) {
  for (int world : {1, 2, 3, 4})
    for (size_t n : {size_t(1000), size_t(4096 + 37), size_t(130)}) {  // 130 over 4: slices 64, 64, 2, 0
      check(world, n, 0.0f);    // no clipping
      check(world, n, 0.05f);   // the spread gradients' norm is far above: clipped
    }
}

}  // namespace
}  // namespace sf::dist
