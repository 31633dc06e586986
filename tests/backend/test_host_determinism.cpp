// Results of HostBackend ops do not depend on the thread count (SF_NUM_THREADS).
// host_pool() is sized once per process, so HostDeterminism.IndependentOfThreadCount re-runs
// this executable with SF_NUM_THREADS = 1, 2, 3 on HostDeterminism.Digest, which runs every op
// on inputs big enough to be split over threads and writes a hash of all output bits to
// $SF_TEST_DIGEST_FILE. The hashes must be identical.
// Why it holds: every op either writes disjoint rows/heads per task, or reduces over fixed
// ranges (columns, 4096-element blocks) combined in a fixed order; OpenBLAS sgemm never splits
// the inner dimension over threads.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    auto b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  // SF_TEST_DIGEST_TRACE=1 prints the hash before each output is added, to find the op
  // whose result differs between two thread counts.
  int stage = 0;
  void trace() {
    if (std::getenv("SF_TEST_DIGEST_TRACE")) fprintf(stderr, "stage %d: %016llx\n", stage, (unsigned long long)h);
    ++stage;
  }
  void add(Mat m) {
    trace();
    for (int64_t r = 0; r < m.rows; ++r) add(m.ptr(r, 0), size_t(m.cols) * m.elem_size());
  }
  void add(const std::vector<float>& v) { trace(); add(v.data(), v.size() * 4); }
};

uint64_t digest_all_ops() {
  Fnv f;
  const int64_t T = 512, C = 128, F = 192, V = 500;
  const int Hq = 4, Hkv = 2, D = 32;
  std::vector<int32_t> cu = {0, 200, 203, 512}, pos(T), ids(T), labels(T);
  for (int s = 0; s < 3; ++s)
    for (int32_t t = cu[size_t(s)]; t < cu[size_t(s + 1)]; ++t) pos[size_t(t)] = t - cu[size_t(s)];
  for (int64_t t = 0; t < T; ++t) {
    ids[size_t(t)] = int32_t((t * 37) % V);
    labels[size_t(t)] = t % 11 == 0 ? -100 : int32_t((t * 53) % V);
  }
  HMat table = HMat::random(V, C, 1), x(T, C), w = HMat::random(1, C, 2);
  host().embedding_forward(stream(), x.mat(), ids.data(), table.mat());
  HMat xn(T, C);
  std::vector<float> rstd(T);
  host().rmsnorm_forward(stream(), xn.mat(), rstd.data(), x.mat(), w.mat(), 1e-6f);
  f.add(xn.mat());
  f.add(rstd);
  HMat wqkv = HMat::random((Hq + 2 * Hkv) * D, C, 3, -1, -0.2f, 0.2f), qkv(T, (Hq + 2 * Hkv) * D);
  host().gemm(stream(), qkv.mat(), xn.mat(), Trans::no, wqkv.mat(), Trans::yes, 1.f, 0.f);
  HMat bias = HMat::random(1, (Hq + 2 * Hkv) * D, 4);
  host().bias_add(stream(), qkv.mat(), bias.mat());
  Mat q = qkv.mat().col_block(0, Hq * D), k = qkv.mat().col_block(Hq * D, Hkv * D),
      v = qkv.mat().col_block((Hq + Hkv) * D, Hkv * D);
  HMat qn_w = HMat::random(1, D, 5);
  std::vector<float> qr(T * Hq);
  host().rmsnorm_forward(stream(), q, qr.data(), q, qn_w.mat(), 1e-6f);
  std::vector<float> inv(D / 2);
  for (int i = 0; i < D / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / D));
  host().rope_forward(stream(), q, Hq, D, pos.data(), inv.data());
  host().rope_forward(stream(), k, Hkv, D, pos.data(), inv.data());
  f.add(qkv.mat());
  AttentionShape sh{Hq, Hkv, D, 1.f / std::sqrt(float(D)), 3, 309};
  HMat att(T, Hq * D), datt = HMat::random(T, Hq * D, 6), dqkv(T, (Hq + 2 * Hkv) * D);
  std::vector<float> lse(Hq * T);
  host().attention_forward(stream(), att.mat(), lse.data(), q, k, v, sh, cu.data());
  host().attention_backward(stream(), dqkv.mat().col_block(0, Hq * D),
                            dqkv.mat().col_block(Hq * D, Hkv * D),
                            dqkv.mat().col_block((Hq + Hkv) * D, Hkv * D), datt.mat(), att.mat(),
                            lse.data(), q, k, v, sh, cu.data());
  f.add(att.mat());
  f.add(lse);
  f.add(dqkv.mat());
  host().rope_backward(stream(), dqkv.mat().col_block(0, Hq * D), Hq, D, pos.data(), inv.data());
  HMat dbias(1, (Hq + 2 * Hkv) * D), dqn_w(1, D);
  host().bias_backward(stream(), dbias.mat(), dqkv.mat());
  host().rmsnorm_backward(stream(), dqkv.mat().col_block(0, Hq * D), dqn_w.mat(),
                          dqkv.mat().col_block(0, Hq * D), q, qn_w.mat(), qr.data(), Mat());
  f.add(dqkv.mat());
  f.add(dbias.mat());
  f.add(dqn_w.mat());
  HMat gu = HMat::random(T, 2 * F, 7, -1, -3.f, 3.f), act(T, F), dact = HMat::random(T, F, 8);
  Mat g = gu.mat().col_block(0, F), u = gu.mat().col_block(F, F);
  host().swiglu_forward(stream(), act.mat(), g, u);
  host().swiglu_backward(stream(), g, u, dact.mat(), g, u);
  f.add(act.mat());
  f.add(gu.mat());
  HMat sum(T, C), out(T, C), dx(T, C), dw(1, C);
  host().add_rmsnorm_forward(stream(), sum.mat(), out.mat(), rstd.data(), x.mat(), xn.mat(),
                             w.mat(), 1e-6f);
  host().rmsnorm_backward(stream(), dx.mat(), dw.mat(), xn.mat(), sum.mat(), w.mat(), rstd.data(),
                          x.mat());
  f.add(out.mat());
  f.add(dx.mat());
  f.add(dw.mat());
  HMat lm = HMat::random(V, C, 9), dh(T, C), dlm(V, C), scratch(64, V);
  float loss = 0;
  host().lm_head_loss(stream(), &loss, dh.mat(), dlm.mat(), out.mat(), lm.mat(), labels.data(),
                      0.01f, scratch.mat());
  f.add(&loss, 4);
  f.add(dh.mat());
  f.add(dlm.mat());
  HMat dtable(V, C);
  host().embedding_backward(stream(), dtable.mat(), ids.data(), dh.mat());
  f.add(dtable.mat());
  float ss = 0;
  host().sum_squares(stream(), &ss, dlm.mat());
  host().sum_squares(stream(), &ss, dtable.mat());
  f.add(&ss, 4);
  const int64_t n = V * C;
  std::vector<float> m(static_cast<size_t>(n)), vv(m), wout(m);
  AdamWStep st;
  st.lr = 1e-3f;
  st.weight_decay = 0.1f;
  host().adamw(stream(), lm.buf.data(), m.data(), vv.data(), dlm.buf.data(), wout.data(), n, st);
  f.add(wout);
  f.add(vv);
  return f.h;
}

}  // namespace

TEST(HostDeterminism, Digest) {
  const uint64_t d = digest_all_ops();
  EXPECT_EQ(d, digest_all_ops());  // repeatable within one process
  if (const char* path = std::getenv("SF_TEST_DIGEST_FILE")) {
    std::ofstream(path) << std::hex << d << "\n";
  }
}

TEST(HostDeterminism, IndependentOfThreadCount) {
  if (std::getenv("SF_TEST_DIGEST_FILE")) GTEST_SKIP() << "child run";
  TempDir dir("sf-determinism");
  // Resolve now: inside std::system, /proc/self/exe would be the shell.
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<std::string> digests;
  for (int threads : {1, 2, 3}) {
    const auto file = dir.path / ("digest" + std::to_string(threads));
    std::ostringstream cmd;
    cmd << "SF_NUM_THREADS=" << threads << " SF_TEST_DIGEST_FILE='" << file.string()
        << "' '" << self.string() << "' --gtest_filter=HostDeterminism.Digest > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.str().c_str()), 0) << cmd.str();
    std::ifstream in(file);
    std::string d;
    in >> d;
    ASSERT_FALSE(d.empty()) << "no digest from " << cmd.str();
    digests.push_back(d);
  }
  EXPECT_EQ(digests[0], digests[1]) << "1 vs 2 threads";
  EXPECT_EQ(digests[0], digests[2]) << "1 vs 3 threads";
}
