// The KV-cache Decoder on tiny random models (llama with llama3 RoPE, qwen2 with q/k/v bias,
// qwen3 with q/k norm and tied embeddings) on the host backend:
//  - token by token through the cache == the whole sequence re-run from scratch, at every
//    length (and in chunks smaller than the prompt);
//  - the logits give the training forward's loss (ReferenceModel) on the same sequence;
//  - streamed weights (two slots filled on a copy stream, real threads) == resident, bitwise;
//  - truncate() then a new tail == a fresh decoder on the new sequence;
//  - a sequence past max_context is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/host/host_backend.h"
#include "backend/threaded_streams_backend.h"
#include "generate/decoder.h"
#include "model/batch.h"
#include "model/model_init.h"
#include "model/reference_model.h"

namespace sf {
namespace {

struct Tiny {
  ModelConfig cfg;
  std::vector<std::vector<float>> params;
  explicit Tiny(Arch arch, bool tied = false) : cfg(tiny_config(arch, tied)) {
    InitOptions init;
    init.matrix_std = 0.3f;  // large enough that attention is far from uniform
    init.norm_jitter = 0.2f;
    init.bias_std = 0.1f;
    params = init_params(ModelLayout::build(cfg), 11, init);
  }
  void load(Decoder& d) const {
    for (int u = 0; u < d.n_units(); ++u) d.set_unit_weights(u, params[size_t(u)].data());
  }
  std::vector<int32_t> tokens(int n, uint32_t seed) const {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((seed * 2654435761u + uint32_t(i) * 40503u) % uint32_t(cfg.vocab_size));
    return t;
  }
};

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::abs(a[i] - b[i])));
  return m;
}

struct ArchCase {
  Arch arch;
  bool tied;
};

class DecoderTest : public ::testing::TestWithParam<ArchCase> {};

// fp32 on the host, logits of order 1: the two paths differ only in GEMM blocking (one row vs
// many), so their logits agree to a few ulps; 1e-5 absolute is far above that and far below
// any real error (a wrong position or cache row moves logits by 1e-2 or more).
constexpr double kLogitTol = 1e-5;

TEST_P(DecoderTest, CachedDecodingEqualsTheFullReforwardAtEveryLength) {
  const Tiny m(GetParam().arch, GetParam().tied);
  HostBackend be;
  DecoderOptions opt;
  opt.max_context = 40;
  opt.chunk_tokens = 7;  // prompts longer than 7 run in chunks
  Decoder inc(be, m.cfg, opt), full(be, m.cfg, opt);
  m.load(inc);
  m.load(full);
  const std::vector<int32_t> seq = m.tokens(30, 3);
  for (size_t n = 1; n <= seq.size(); ++n) {
    const std::vector<float> a = copy(inc.append(std::span(seq).subspan(n - 1, 1)));
    full.truncate(0);
    const std::vector<float> b = copy(full.append(std::span(seq).first(n)));
    ASSERT_EQ(inc.cached(), int64_t(n));
    ASSERT_LE(max_abs_diff(a, b), kLogitTol) << "length " << n;
  }
}

TEST_P(DecoderTest, LogitsGiveTheTrainingForwardsLoss) {
  const Tiny m(GetParam().arch, GetParam().tied);
  HostBackend be;
  DecoderOptions opt;
  opt.max_context = 32;
  Decoder d(be, m.cfg, opt);
  m.load(d);
  const std::vector<int32_t> seq = m.tokens(24, 5);
  double ours = 0;
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    const std::vector<float> l = copy(d.append(std::span(seq).subspan(i, 1)));
    double mx = -1e30, sum = 0;
    for (float x : l) mx = std::max(mx, double(x));
    for (float x : l) sum += std::exp(double(x) - mx);
    ours += mx + std::log(sum) - double(l[size_t(seq[i + 1])]);
  }
  ReferenceModel ref(be, m.cfg, int64_t(seq.size()));
  for (int u = 0; u < ref.n_units(); ++u) ref.set_unit_weights(u, m.params[size_t(u)].data());
  Batch b = Batch::from_rows({seq});
  const double theirs = ref.forward(b);
  // Summed cross-entropy over 23 tokens, fp32 throughout on both sides.
  EXPECT_NEAR(ours, theirs, 1e-5 * std::abs(theirs)) << "decoder " << ours << ", reference " << theirs;
}

TEST_P(DecoderTest, StreamedWeightsGiveTheResidentLogitsBitwise) {
  const Tiny m(GetParam().arch, GetParam().tied);
  HostBackend host;
  // Real asynchronous streams: a copy the compute stream does not wait for reads a stale or
  // half-written slot and changes the logits.
  ThreadedStreamsBackend threaded(host, {2, 200});
  DecoderOptions opt;
  opt.max_context = 24;
  opt.chunk_tokens = 5;
  Decoder resident(host, m.cfg, opt);
  opt.placement = WeightPlacement::placement_streamed;
  Decoder streamed(threaded, m.cfg, opt);
  m.load(resident);
  m.load(streamed);
  const std::vector<int32_t> seq = m.tokens(20, 9);
  const std::vector<float> a = copy(resident.append(std::span(seq).first(12)));
  const std::vector<float> b = copy(streamed.append(std::span(seq).first(12)));
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "prefill";
  for (size_t i = 12; i < seq.size(); ++i) {
    const std::vector<float> x = copy(resident.append(std::span(seq).subspan(i, 1)));
    const std::vector<float> y = copy(streamed.append(std::span(seq).subspan(i, 1)));
    ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << "token " << i;
  }
}

TEST_P(DecoderTest, TruncateThenANewTailEqualsAFreshDecoder) {
  const Tiny m(GetParam().arch, GetParam().tied);
  HostBackend be;
  DecoderOptions opt;
  opt.max_context = 32;
  Decoder d(be, m.cfg, opt), fresh(be, m.cfg, opt);
  m.load(d);
  m.load(fresh);
  const std::vector<int32_t> first = m.tokens(16, 1), tail = m.tokens(6, 2);
  (void)d.append(first);
  d.truncate(10);
  const std::vector<float> a = copy(d.append(tail));
  std::vector<int32_t> seq(first.begin(), first.begin() + 10);
  seq.insert(seq.end(), tail.begin(), tail.end());
  const std::vector<float> b = copy(fresh.append(seq));
  EXPECT_EQ(d.cached(), 16);
  EXPECT_LE(max_abs_diff(a, b), kLogitTol);
}

INSTANTIATE_TEST_SUITE_P(Archs, DecoderTest,
                         ::testing::Values(ArchCase{Arch::llama, false}, ArchCase{Arch::qwen2, false},
                                           ArchCase{Arch::qwen3, true}),
                         [](const auto& i) {
                           return std::string(arch_name(i.param.arch)) + (i.param.tied ? "_tied" : "");
                         });

TEST(DecoderChecks, RefusesTokensPastTheContextAndOutsideTheVocabulary) {
  const Tiny m(Arch::llama);
  HostBackend be;
  DecoderOptions opt;
  opt.max_context = 8;
  Decoder d(be, m.cfg, opt);
  m.load(d);
  (void)d.append(m.tokens(6, 1));
  try {
    (void)d.append(m.tokens(3, 2));
    FAIL() << "9 tokens in a context of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-context"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d.cached(), 6);
  const int32_t bad = int32_t(m.cfg.vocab_size);
  EXPECT_THROW((void)d.append(std::span<const int32_t>(&bad, 1)), Error);
}

}  // namespace
}  // namespace sf
