// Fused chunked LM head + cross-entropy on the GPU against the host reference.
//
// Tolerances: the loss sum is f32 from f32 logits (cuBLASLt, bf16 inputs): 1e-5 relative. dh
// is bf16 output of a bf16 dlogits GEMM (dlogits rounded to bf16 as in PyTorch's bf16 path):
// 1e-2. dw is f32 accumulation of bf16 dlogits products: 1e-2 (the bf16 rounding of dlogits
// dominates, ~2e-3 RMS).
#include "cuda_test_util.h"

namespace sf::test {
namespace {

struct LmCase {
  int64_t T, C, V, chunk;
  bool grads;
};

void run_case(const LmCase& c, uint64_t seed) {
  const std::string what = cat("lm_head T", c.T, " C", c.C, " V", c.V, " chunk", c.chunk,
                               c.grads ? " +grads" : " loss only");
  SCOPED_TRACE(what);
  auto vh = rand_bf16(size_t(c.T * c.C), seed, -2.f, 2.f);
  auto vw = rand_bf16(size_t(c.V * c.C), seed + 1, -0.1f, 0.1f);
  auto vdw = random_vec(size_t(c.V * c.C), seed + 2, -1e-3f, 1e-3f);
  std::vector<int32_t> labels(size_t(c.T));
  std::mt19937 g{uint32_t(seed)};
  for (auto& l : labels) l = g() % 5 == 0 ? -100 : int32_t(g() % uint32_t(c.V));
  labels.back() = int32_t(c.V - 1);  // the label that shares its slot with the row loss
  const float grad_scale = 1.f / 37.f;

  DevMat h(DType::bf16, c.T, c.C), w(DType::bf16, c.V, c.C), dh(DType::bf16, c.T, c.C, c.C + 8),
      dw(DType::f32, c.V, c.C), scratch(DType::f32, c.chunk, c.V);
  h.upload(vh);
  w.upload(vw);
  dw.upload(vdw);
  dh.poison();
  scratch.poison();
  DevArray<int32_t> dl(labels);
  DevArray<float> loss(std::vector<float>{2.5f});
  gpu().lm_head_loss(gs(), loss.ptr(), c.grads ? dh.m : Mat(), c.grads ? dw.m : Mat(), h.m, w.m,
                     dl.ptr(), grad_scale, scratch.m);

  HostMat hh(c.T, c.C, vh), hw(c.V, c.C, vw), hdh(c.T, c.C), hdw(c.V, c.C, vdw),
      hscr(c.chunk, c.V);
  float hloss = 2.5f;
  host().lm_head_loss(hs(), &hloss, c.grads ? hdh.m : Mat(), c.grads ? hdw.m : Mat(), hh.m, hw.m,
                      labels.data(), grad_scale, hscr.m);
  expect_close(what + " loss", loss.download(), {hloss}, 1e-5);
  if (c.grads) {
    expect_close(what + " dh", dh.download(), hdh.v, 1e-2);
    // Compare the increments (dw started at a random value).
    auto got = dw.download();
    for (size_t i = 0; i < got.size(); ++i) {
      got[i] -= vdw[i];
      hdw.v[i] -= vdw[i];
    }
    expect_close(what + " dw increment", got, hdw.v, 1e-2);
    EXPECT_TRUE(dh.guards_intact());
  }
}

TEST(CudaLmHead, OddVocabularyScalarPath) {
  SF_REQUIRE_GPU();
  run_case({37, 64, 1001, 16, true}, 1);
  run_case({37, 64, 1001, 64, false}, 2);
  run_case({5, 40, 50257, 2, true}, 3);  // GPT-2 vocabulary
}

TEST(CudaLmHead, LargeVocabulary) {
  SF_REQUIRE_GPU();
  run_case({40, 512, 32000, 16, true}, 4);
  run_case({24, 256, 128256, 24, true}, 5);  // Llama 3 vocabulary, one chunk
}

}  // namespace
}  // namespace sf::test
