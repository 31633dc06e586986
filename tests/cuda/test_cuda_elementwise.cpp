// Elementwise ops, reductions, embedding and AdamW on the GPU against the host reference.
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda_test_util.h"

namespace sf::test {
namespace {

// Shapes: odd sizes (scalar paths), multiples of 8 (vector paths), strided views (pad > 0).
struct Shape {
  int64_t rows, cols, pad;
};
const Shape kShapes[] = {{1, 1, 0}, {22, 65, 0}, {65, 22, 3}, {7, 4096, 0}, {33, 136, 8},
                         {3, 1000003, 0}};

std::string sname(const char* op, const Shape& s) {
  return cat(op, " [", s.rows, "x", s.cols, "] pad ", s.pad);
}

TEST(CudaCast, AllPairsBitExact) {
  SF_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Shape& s : kShapes)
    for (DType from : {DType::f32, DType::bf16, DType::f16})
      for (DType to : {DType::f32, DType::bf16, DType::f16}) {
        const std::string what = sname("cast", s) + cat(" ", dtype_name(from), "->", dtype_name(to));
        SCOPED_TRACE(what);
        auto v = random_vec(size_t(s.rows * s.cols), seed++, -100.f, 100.f);
        DevMat src(from, s.rows, s.cols, s.cols + s.pad), dst(to, s.rows, s.cols, s.cols + s.pad);
        src.upload(v);
        auto exact_src = src.download();  // what the source holds after its own rounding
        dst.poison();
        gpu().cast(gs(), dst.m, src.m);
        // Round to nearest even, exactly as core/dtype's conversions (the host reference).
        std::vector<float> want(exact_src.size());
        std::vector<unsigned char> tmp(exact_src.size() * dtype_size(to));
        convert_from_f32(exact_src.data(), tmp.data(), to, exact_src.size());
        convert_to_f32(tmp.data(), to, want.data(), exact_src.size());
        expect_bitwise(what, dst.download(), want);
        EXPECT_TRUE(dst.guards_intact());
      }
}

// Widening casts of one contiguous run take an aligned 4-element path with scalar head and
// tail pieces; element offsets move the run off 16-byte alignment (dst) and 8-byte alignment
// (src), together (head peeled, then aligned) or apart (the generic path). Elements of the
// buffers outside the run must keep their bytes.
TEST(CudaCast, WidenToF32OffsetsAndTails) {
  SF_REQUIRE_GPU();
  uint64_t seed = 30;
  for (DType from : {DType::bf16, DType::f16})
    for (auto [src_off, dst_off] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {2, 2}, {3, 3},
                                    {1, 0}, {0, 2}, {2, 1}})
      for (int64_t n : {int64_t(1), int64_t(3), int64_t(4), int64_t(5), int64_t(4099),
                        int64_t(1000003)}) {
        const std::string what = cat("cast ", dtype_name(from), "->f32 n ", n, " src+", src_off,
                                     " dst+", dst_off);
        SCOPED_TRACE(what);
        DevMat src(from, 1, n + 4), dst(DType::f32, 1, n + 4);
        src.upload(random_vec(size_t(n + 4), seed++, -100.f, 100.f));
        const auto exact_src = src.download();  // after the source's own rounding
        dst.poison();
        const auto before = dst.raw();
        const Mat s(static_cast<char*>(src.m.data) + src_off * 2, from, 1, n);
        const Mat d(static_cast<float*>(dst.m.data) + dst_off, DType::f32, 1, n);
        gpu().cast(gs(), d, s);
        const auto after = dst.raw();
        const auto got = dst.download();
        expect_bitwise(what, std::vector<float>(got.begin() + dst_off, got.begin() + dst_off + n),
                       std::vector<float>(exact_src.begin() + src_off,
                                          exact_src.begin() + src_off + n));
        int64_t touched = 0;  // bytes outside the run that changed
        for (size_t b = 0; b < before.size(); ++b)
          if (before[b] != after[b] &&
              (b < size_t(dst_off) * 4 || b >= size_t(dst_off + n) * 4))
            ++touched;
        EXPECT_EQ(touched, 0) << what;
      }
}

TEST(CudaAxpy, F32AndBf16Destinations) {
  SF_REQUIRE_GPU();
  uint64_t seed = 50;
  for (const Shape& s : kShapes)
    for (DType dt : {DType::f32, DType::bf16})
      for (DType st : {DType::f32, DType::bf16}) {
        const std::string what = sname("axpy", s) + cat(" dst ", dtype_name(dt), " src ", dtype_name(st));
        SCOPED_TRACE(what);
        auto vd = random_vec(size_t(s.rows * s.cols), seed++);
        auto vs = random_vec(size_t(s.rows * s.cols), seed++);
        if (dt == DType::bf16) vd = round_all_bf16(vd);
        if (st == DType::bf16) vs = round_all_bf16(vs);
        DevMat d(dt, s.rows, s.cols, s.cols + s.pad), src(st, s.rows, s.cols, s.cols + s.pad);
        d.upload(vd);
        src.upload(vs);
        gpu().axpy(gs(), d.m, src.m, -0.75f);
        HostMat hd(s.rows, s.cols, vd), hsrc(s.rows, s.cols, vs);
        host().axpy(hs(), hd.m, hsrc.m, -0.75f);
        if (dt == DType::f32)
          expect_bitwise(what, d.download(), hd.v);  // one fma-free multiply-add per element
        else
          expect_close(what, d.download(), round_all_bf16(hd.v), 5e-3);  // bf16 output rounding
        EXPECT_TRUE(d.guards_intact());
      }
}

TEST(CudaSumSquares, MatchesDoubleReference) {
  SF_REQUIRE_GPU();
  uint64_t seed = 90;
  for (const Shape& s : kShapes)
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string what = sname("sum_squares", s) + cat(" ", dtype_name(t));
      auto v = random_vec(size_t(s.rows * s.cols), seed++);
      if (t == DType::bf16) v = round_all_bf16(v);
      DevMat x(t, s.rows, s.cols, s.cols + s.pad);
      x.upload(v);
      DevArray<float> out(std::vector<float>{1.5f});  // accumulates
      gpu().sum_squares(gs(), out.ptr(), x.m);
      float want = 1.5f;
      HostMat hx(s.rows, s.cols, v);
      host().sum_squares(hs(), &want, hx.m);
      // f32 partial sums over ~hundreds of elements per thread: relative error ~1e-6.
      expect_close(what, out.download(), {want}, 1e-5);
    }
}

TEST(CudaSumSquares, DeterministicAcrossRuns) {
  SF_REQUIRE_GPU();
  DevMat x(DType::f32, 1, 5000011);
  x.upload(random_vec(5000011, 5));
  std::vector<float> results;
  for (int i = 0; i < 3; ++i) {
    DevArray<float> out(std::vector<float>{0.f});
    gpu().sum_squares(gs(), out.ptr(), x.m);
    results.push_back(out.download()[0]);
  }
  expect_bitwise("sum_squares repeatable", {results[1], results[2]}, {results[0], results[0]});
}

TEST(CudaBias, AddAndBackward) {
  SF_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const Shape& s : {Shape{22, 65, 0}, Shape{65, 22, 5}, Shape{300, 6144, 0},
                         Shape{1, 8, 0}, Shape{1000, 40, 8}}) {
    SCOPED_TRACE(sname("bias", s));
    auto vx = rand_bf16(size_t(s.rows * s.cols), seed++), vb = rand_bf16(size_t(s.cols), seed++);
    DevMat x(DType::bf16, s.rows, s.cols, s.cols + s.pad), b(DType::bf16, 1, s.cols);
    x.upload(vx);
    b.upload(vb);
    gpu().bias_add(gs(), x.m, b.m);
    HostMat hx(s.rows, s.cols, vx), hb(1, s.cols, vb);
    host().bias_add(hs(), hx.m, hb.m);
    expect_close(sname("bias_add", s), x.download(), round_all_bf16(hx.v), 5e-3);
    EXPECT_TRUE(x.guards_intact());

    auto vdb = random_vec(size_t(s.cols), seed++);
    DevMat db(DType::f32, 1, s.cols);
    db.upload(vdb);
    DevMat dy(DType::bf16, s.rows, s.cols, s.cols + s.pad);
    dy.upload(vx);
    gpu().bias_backward(gs(), db.m, dy.m);
    HostMat hdb(1, s.cols, vdb), hdy(s.rows, s.cols, vx);
    host().bias_backward(hs(), hdb.m, hdy.m);
    // f32 column sums of up to 1000 bf16 values, order differs from the host's double sum.
    expect_close(sname("bias_backward", s), db.download(), hdb.v, 1e-5);
  }
}

TEST(CudaEmbedding, ForwardGatherIsExact) {
  SF_REQUIRE_GPU();
  for (auto [V, C, T] : {std::tuple<int64_t, int64_t, int64_t>{50, 65, 22}, {1000, 4096, 37}}) {
    const std::string what = cat("embedding_forward V", V, " C", C, " T", T);
    auto table = rand_bf16(size_t(V * C), uint64_t(V));
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7919 + 3) % V);
    DevMat dt(DType::bf16, V, C), out(DType::bf16, T, C, C + 8);
    dt.upload(table);
    out.poison();
    DevArray<int32_t> dids(ids);
    gpu().embedding_forward(gs(), out.m, dids.ptr(), dt.m);
    HostMat ht(V, C, table), ho(T, C);
    host().embedding_forward(hs(), ho.m, ids.data(), ht.m);
    expect_bitwise(what, out.download(), ho.v);
    EXPECT_TRUE(out.guards_intact());
  }
}

// The engine's forward gather: an fp32 table in ordinary (pageable, mmap'd) host memory,
// mapped with map_host, read by the kernel over PCIe and rounded once to bf16.
TEST(CudaEmbedding, ForwardFromMappedHostF32TableRoundsOnce) {
  SF_REQUIRE_GPU();
  const int64_t V = 3000, C = 4096, T = 517;
  // Page-aligned, as the engine's master arrays are (mmap); values need all 24 mantissa bits.
  const size_t bytes = size_t(V * C) * sizeof(float);
  void* mem = std::aligned_alloc(4096, bytes);
  ASSERT_NE(mem, nullptr);
  auto v = random_vec(size_t(V * C), 11, -3.f, 3.f);
  std::memcpy(mem, v.data(), bytes);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7919 + 5) % V);
  ids[3] = ids[200] = int32_t(V - 1);  // a repeat and the last row
  {
    auto mapped = gpu().map_host(mem, bytes, "test table");
    Mat table{mapped->data(), DType::f32, V, C, C};
    DevMat out(DType::bf16, T, C, C + 8);
    out.poison();
    DevArray<int32_t> dids(ids);
    gpu().embedding_forward(gs(), out.m, dids.ptr(), table);
    gs().synchronize();
    HostMat ht(V, C, v), ho(T, C);
    host().embedding_forward(hs(), ho.m, ids.data(), ht.m);
    expect_bitwise("embedding_forward from mapped f32", out.download(), round_all_bf16(ho.v));
    EXPECT_TRUE(out.guards_intact());
  }
  std::free(mem);  // after the mapping is gone
}

TEST(CudaEmbedding, BackwardDuplicatesInTokenOrderIsExact) {
  SF_REQUIRE_GPU();
  // Many repeated ids (vocabulary 13 for 700 tokens) and a repeat spanning block chunks.
  for (auto [V, C, T] : {std::tuple<int64_t, int64_t, int64_t>{13, 65, 700}, {300, 4096, 600}}) {
    const std::string what = cat("embedding_backward V", V, " C", C, " T", T);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    std::mt19937 g(5);
    for (auto& id : ids) id = int32_t(g() % uint32_t(V));
    // Negative ids are skipped (the engine's scatter into blocks of rows).
    for (size_t t = 5; t < ids.size(); t += 7) ids[t] = -1;
    auto dout = rand_bf16(size_t(T * C), 9);
    auto dtab = random_vec(size_t(V * C), 10);
    DevMat ddt(DType::f32, V, C), ddo(DType::bf16, T, C);
    ddt.upload(dtab);
    ddo.upload(dout);
    DevArray<int32_t> dids(ids);
    gpu().embedding_backward(gs(), ddt.m, dids.ptr(), ddo.m);
    HostMat ht(V, C, dtab), hdo(T, C, dout);
    host().embedding_backward(hs(), ht.m, ids.data(), hdo.m);
    // Same f32 additions in the same (token) order as the host: bit for bit.
    expect_bitwise(what, ddt.download(), ht.v);
  }
}

TEST(CudaAdamW, BitExactWithHostIncludingTailAndUnaligned) {
  SF_REQUIRE_GPU();
  AdamWStep st;
  st.lr = 3e-4f;
  st.weight_decay = 0.1f;
  st.step = 7;
  st.grad_scale = 0.37f;
  for (int64_t offset : {0, 1})
    for (int64_t n : {int64_t(1), int64_t(1000003), int64_t(4096)}) {
      const std::string what = cat("adamw n", n, " offset ", offset);
      auto p = random_vec(size_t(n + offset), 1), m = random_vec(size_t(n + offset), 2, -0.01f, 0.01f);
      auto v = random_vec(size_t(n + offset), 3, 0.f, 1e-4f), g = random_vec(size_t(n + offset), 4);
      DevArray<float> dp(p), dm(m), dv(v), dg(g);
      DevMat w(DType::bf16, 1, n + offset);
      w.poison();
      gpu().adamw(gs(), dp.ptr() + offset, dm.ptr() + offset, dv.ptr() + offset, dg.ptr() + offset,
                  static_cast<uint16_t*>(w.m.data) + offset, n, st);
      std::vector<float> hw(size_t(n + offset));
      host().adamw(hs(), p.data() + offset, m.data() + offset, v.data() + offset, g.data() + offset,
                   hw.data() + offset, n, st);
      expect_bitwise(what + " param", dp.download(), p);
      expect_bitwise(what + " m", dm.download(), m);
      expect_bitwise(what + " v", dv.download(), v);
      auto wd = w.download();
      std::vector<float> got(wd.begin() + offset, wd.end()), want;
      for (int64_t i = 0; i < n; ++i) want.push_back(round_bf16(hw[size_t(i + offset)]));
      expect_bitwise(what + " bf16 weights", got, want);
    }
}

}  // namespace
}  // namespace sf::test
