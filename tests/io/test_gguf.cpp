// io/gguf: the reader against a file gguf-py wrote (tests/data/gguf/vectors.gguf, made by
// scripts/gen_gguf_vectors.py: every value type, and each readable tensor type next to
// gguf-py's own dequantization, compared bit for bit), hand-built images (versions 2/3,
// default alignment, shapes), one test per malformed input checking the message, and seeded
// mutation fuzzing (every result is a parse or an sf::Error, never a crash).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf.h"
#include "parse_refusal.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

// ---- a small GGUF image builder (test-only) ---------------------------------------------

struct Bytes {
  std::vector<uint8_t> b;
  Bytes& u8(uint8_t v) { b.push_back(v); return *this; }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& f32(float v) { return raw(&v, 4); }
  Bytes& str(std::string_view s) { u64(s.size()); return raw(s.data(), s.size()); }
  Bytes& raw(const void* p, size_t n) {
    auto c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& add(const Bytes& o) { b.insert(b.end(), o.b.begin(), o.b.end()); return *this; }
};

struct Kv {
  std::string key;
  uint32_t type;
  Bytes value;  // the value's bytes after the type
};
struct Ti {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

Kv kv_u32(const std::string& k, uint32_t v) { return {k, 4, Bytes().u32(v)}; }
Kv kv_str(const std::string& k, const std::string& v) { return {k, 8, Bytes().str(v)}; }

// header | kvs | tensor infos | zero padding to `align` | data
std::vector<uint8_t> image(const std::vector<Kv>& kvs, const std::vector<Ti>& tis,
                           const std::vector<uint8_t>& data = {}, uint32_t version = 3,
                           uint64_t align = 32) {
  Bytes o;
  o.raw("GGUF", 4).u32(version).u64(tis.size()).u64(kvs.size());
  for (auto& kv : kvs) o.str(kv.key).u32(kv.type).add(kv.value);
  for (auto& t : tis) {
    o.str(t.name).u32(uint32_t(t.dims.size()));
    for (auto d : t.dims) o.u64(d);
    o.u32(t.type).u64(t.offset);
  }
  while (o.b.size() % align) o.u8(0);
  o.raw(data.data(), data.size());
  return o.b;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A valid image with metadata of several kinds and two F32 tensors (the fuzz seed).
std::vector<uint8_t> sample_image() {
  std::vector<uint8_t> data = f32_bytes({1, 2, 3, 4, 5, 6});
  data.resize(32, 0);  // next tensor at offset 32
  auto q8 = std::vector<uint8_t>(34, 7);
  data.insert(data.end(), q8.begin(), q8.end());
  Bytes arr;
  arr.u32(8).u64(2).str("ab").str("c");
  Bytes nested;
  nested.u32(9).u64(1).u32(4).u64(2).u32(5).u32(6);
  return image({kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 2),
                {"tokens", 9, arr}, {"nested", 9, nested}, {"flag", 7, Bytes().u8(1)}},
               {{"a", {3, 2}, ggml_type::F32, 0}, {"b", {32}, ggml_type::Q8_0, 32}}, data);
}

std::string parse_error(const std::vector<uint8_t>& b, const std::string& src = "mem.gguf") {
  return test::parse_error_of<GgufView>(b, src);
}

// Expects the image to be refused with a message naming the source and containing `needle`.
void expect_bad(const std::vector<uint8_t>& b, const std::string& needle) {
  test::expect_parse_refused<GgufView>(b, "mem.gguf", needle);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- the gguf-py file -------------------------------------------------------------------

fs::path vectors_path() { return test::source_dir() / "tests/data/gguf/vectors.gguf"; }

TEST(Gguf, ReadsMetadataGgufPyWrote) {
  GgufFile f(vectors_path());
  const GgufView& g = f.view();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.data_offset(), 1216u);  // what gguf-py's reader says (GGUFReader.data_offset)
  EXPECT_EQ(g.get("general.architecture").as_string("a"), "test");
  EXPECT_EQ(g.get("t.u8").as_int("k"), 200);
  EXPECT_EQ(g.get("t.i8").as_int("k"), -100);
  EXPECT_EQ(g.get("t.u16").as_int("k"), 60000);
  EXPECT_EQ(g.get("t.i16").as_int("k"), -30000);
  EXPECT_EQ(g.get("t.u32").as_int("k"), 4000000000);
  EXPECT_EQ(g.get("t.i32").as_int("k"), -2000000000);
  EXPECT_EQ(g.get("t.f32").as_double("k"), 100000.0);
  EXPECT_EQ(g.get("t.f32").type(), GgufType::f32);
  EXPECT_TRUE(g.get("t.bool").as_bool("k"));
  EXPECT_EQ(g.get("t.string").as_string("k"), "h\xc3\xa9llo, gguf");
  EXPECT_EQ(g.get("t.u64").as_double("k"), 18000000000000000000.0);
  EXPECT_THROW(g.get("t.u64").as_int("t.u64"), Error);  // > INT64_MAX
  EXPECT_EQ(g.get("t.i64").as_int("k"), -9000000000000000000);
  EXPECT_EQ(g.get("t.f64").as_double("k"), 0.1);
  const GgufValue& ai = g.get("t.arr_i32");
  ASSERT_EQ(ai.size(), 3u);
  EXPECT_EQ(ai.elem_type(), GgufType::i32);
  EXPECT_EQ(ai.int_at(1, "k"), -2);
  EXPECT_EQ(g.get("t.arr_f32").double_at(1, "k"), -1.25);
  EXPECT_EQ(g.get("t.arr_str").string_at(1, "k"), "");
  EXPECT_EQ(g.get("t.arr_str").string_at(2, "k"), "xyz");
  EXPECT_EQ(g.get("t.arr_bool").size(), 2u);
  const GgufValue& n = g.get("t.arr_nested");
  ASSERT_EQ(n.size(), 2u);
  EXPECT_EQ(n.array_at(0, "k").int_at(1, "k"), 2);
  EXPECT_EQ(n.array_at(1, "k").int_at(0, "k"), 3);
  EXPECT_EQ(g.get("t.arr_nested").describe(), "array of 2 array");
  // Type errors name the key.
  try {
    g.get("t.string").as_int("t.string");
    FAIL() << "as_int of a string";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"t.string\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.find("no.such.key"), nullptr);
  EXPECT_THROW(g.get("no.such.key"), Error);
}

TEST(Gguf, DequantizesBitIdenticalToGgufPy) {
  GgufFile f(vectors_path());
  const GgufView& g = f.view();
  struct Case {
    const char* name;
    uint32_t type;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{"q4_1", ggml_type::Q4_1, {2, 512}},
                        {"q8_0", ggml_type::Q8_0, {4, 128}},
                        {"f16", ggml_type::F16, {16, 16}},
                        {"bf16", ggml_type::BF16, {128}},
                        {"f32", ggml_type::F32, {2, 3, 4}}};
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    const GgufTensorInfo& t = g.get_tensor(c.name);
    EXPECT_EQ(t.type, c.type);
    EXPECT_EQ(t.shape(), c.shape);
    std::vector<float> got = g.read_f32(c.name);
    std::vector<float> want = g.read_f32(std::string(c.name) + ".expected");
    ASSERT_EQ(got.size(), want.size());
    // Exact: the same arithmetic in the same order (NaN payloads included, hence bits).
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (bits(got[i]) != bits(want[i]) && bad++ < 5)
        ADD_FAILURE() << c.name << "[" << i << "]: " << got[i] << " (0x" << std::hex
                      << bits(got[i]) << ") vs gguf-py " << want[i] << " (0x" << bits(want[i])
                      << std::dec << ")";
    EXPECT_EQ(bad, 0u);
  }
  // The data is not trivial: Q4_1 holds every nibble, subnormal and negative scales.
  std::vector<float> q = g.read_f32("q4_1");
  int64_t nonzero = 0, negative = 0;
  for (float v : q) nonzero += v != 0, negative += v < 0;
  EXPECT_GT(nonzero, 900);
  EXPECT_GT(negative, 100);
}

TEST(Gguf, Q4_1NibbleOrderAndRounding) {
  // One block by hand: d = 0.50048828125 (f16 0x3801), m = -2.998046875 (f16 0xC1FF),
  // q_j = j for j < 16 (low nibbles) and 15 - (j - 16) (high nibbles).
  const uint16_t d16 = 0x3801, m16 = 0xC1FF;
  uint8_t block[20];
  std::memcpy(block, &d16, 2);
  std::memcpy(block + 2, &m16, 2);
  for (int j = 0; j < 16; ++j) block[4 + j] = uint8_t(j | (15 - j) << 4);
  float out[32];
  gguf_dequantize(block, ggml_type::Q4_1, out, 32, "block");
  const double d = f16_to_f32(d16), m = f16_to_f32(m16);
  for (int j = 0; j < 32; ++j) {
    const int qv = j < 16 ? j : 15 - (j - 16);
    // d * q is exact in double (11 x 4 bits) and in float; (d * q) + m is exact in double
    // (the spans of f16-made values fit in 53 bits), so one rounding to float is numpy's.
    const float want = float(double(float(d * qv)) + m);
    EXPECT_EQ(bits(out[j]), bits(want)) << j;
  }
  EXPECT_THROW(gguf_dequantize(block, 12, out, 32, "k-quant"), Error);
}

// ---- hand-built images ------------------------------------------------------------------

TEST(Gguf, Versions2And3DefaultAlignmentAndShapes) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE(version);
    auto b = image({kv_str("general.architecture", "llama"), {"empty", 9, Bytes().u32(4).u64(0)}},
                   {{"w", {3, 2}, ggml_type::F32, 0}}, f32_bytes({1, 2, 3, 4, 5, 6}), version);
    GgufView g = GgufView::parse(b.data(), b.size(), "mem.gguf");
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.alignment(), 32u);
    EXPECT_EQ(g.data_offset() % 32, 0u);
    EXPECT_EQ(g.data_offset() + 24, b.size());
    EXPECT_EQ(g.get("empty").size(), 0u);
    const GgufTensorInfo& t = g.get_tensor("w");
    EXPECT_EQ(t.dims, (std::vector<int64_t>{3, 2}));  // innermost first, as stored
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t.numel, 6);
    EXPECT_EQ(t.bytes, 24u);
    EXPECT_EQ(g.read_f32("w"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
  // No tensors, no data section: valid.
  auto b = image({kv_u32("general.alignment", 64)}, {});
  GgufView g = GgufView::parse(b.data(), b.size(), "mem.gguf");
  EXPECT_EQ(g.tensors().size(), 0u);
  EXPECT_EQ(g.alignment(), 64u);
}

TEST(Gguf, RefusesUnreadableTypesNamingTensorAndType) {
  auto b = image({}, {{"blk.0.ffn_down.weight", {256}, 12, 0}}, std::vector<uint8_t>(144, 0));
  GgufView g = GgufView::parse(b.data(), b.size(), "mem.gguf");
  EXPECT_FALSE(gguf_can_read_f32(12));
  try {
    g.read_f32("blk.0.ffn_down.weight");
    FAIL() << "a Q4_K tensor was read";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("mem.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("blk.0.ffn_down.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("Q4_K"), std::string::npos) << m;
  }
  EXPECT_THROW(g.read_f32("missing"), Error);
}

TEST(Gguf, RefusesMalformedHeaders) {
  expect_bad({}, "not a GGUF file");
  expect_bad({'G', 'G', 'U', 'X', 3, 0, 0, 0}, "not a GGUF file");
  auto v = [](uint32_t version) { return image({}, {}, {}, version); };
  expect_bad(v(1), "version 1 is not supported");
  expect_bad(v(4), "version 4 is not supported");
  expect_bad(v(0x03000000), "big-endian");
  // Counts that cannot fit in the file are refused before anything is allocated.
  auto counts = [](uint64_t n_tensors, uint64_t n_kv) {
    Bytes o;
    o.raw("GGUF", 4).u32(3).u64(n_tensors).u64(n_kv);
    return o.b;
  };
  expect_bad(counts(0, uint64_t(1) << 62), "key/value count claims");
  expect_bad(counts(~uint64_t(0), 0), "tensor count claims");
  // A string length larger than the file, and a key longer than the format allows.
  {
    Bytes o;
    o.raw("GGUF", 4).u32(3).u64(0).u64(1).u64(~uint64_t(0) - 3).raw("abcdefgh", 8);
    expect_bad(o.b, "allows at most 65535");
    Bytes p;
    p.raw("GGUF", 4).u32(3).u64(0).u64(1).u64(1000).raw("abcdefgh", 8);
    expect_bad(p.b, "needs 1000 bytes but only 8 remain");
  }
  expect_bad(image({{"", 4, Bytes().u32(1)}}, {}), "is empty");
  expect_bad(image({{"k", 13, Bytes().u32(1)}}, {}), "not a GGUF value type");
  expect_bad(image({{"k", 7, Bytes().u8(2)}}, {}), "bool of value 2");
  expect_bad(image({{"k", 9, Bytes().u32(7).u64(2).u8(1).u8(3)}}, {}), "bool of value 3");
  expect_bad(image({{"k", 9, Bytes().u32(14).u64(1)}}, {}), "not a GGUF value type");
  expect_bad(image({{"k", 9, Bytes().u32(6).u64(uint64_t(1) << 61)}}, {}), "claims");
  expect_bad(image({{"k", 9, Bytes().u32(8).u64(uint64_t(1) << 40)}}, {}), "claims");
  expect_bad(image({kv_u32("k", 1), kv_u32("k", 2)}, {}), "appears twice");
  {
    Bytes deep;
    for (int i = 0; i < 9; ++i) deep.u32(9).u64(1);
    deep.u32(4).u64(0);
    expect_bad(image({{"k", 9, deep}}, {}), "nests arrays deeper");
  }
  expect_bad(image({kv_u32("general.alignment", 48)}, {}), "power of two");
  expect_bad(image({kv_u32("general.alignment", 0)}, {}), "power of two");
  expect_bad(image({kv_str("general.alignment", "32")}, {}), "must be a uint32");
}

TEST(Gguf, RefusesMalformedTensorInfos) {
  const std::vector<uint8_t> data(64, 0);
  auto one = [&](Ti t, const std::vector<uint8_t>& d) { return image({}, {std::move(t)}, d); };
  expect_bad(one({"", {4}, 0, 0}, data), "empty name");
  expect_bad(one({std::string(65, 'x'), {4}, 0, 0}, data), "allows at most 64");
  expect_bad(one({"t", {1, 1, 1, 1, 1}, 0, 0}, data), "at most 4");
  expect_bad(one({"t", {uint64_t(1) << 40, uint64_t(1) << 40}, 0, 0}, data), "too large");
  expect_bad(one({"t", {~uint64_t(0)}, 0, 0}, data), "too large");
  expect_bad(one({"t", {4}, 99, 0}, data), "ggml type id 99");
  expect_bad(one({"t", {33}, ggml_type::Q4_1, 0}, data), "not a multiple of its block size 32");
  expect_bad(one({"t", {4}, 0, 16}, data), "not a multiple of the alignment 32");
  expect_bad(one({"t", {17}, 0, 0}, data), "ends past the end of the file");
  expect_bad(one({"t", {4}, 0, ~uint64_t(0) - 31}, data), "ends past the end of the file");
  expect_bad(image({}, {{"a", {16}, 0, 0}, {"b", {4}, 0, 32}}, data), "overlap");
  expect_bad(image({}, {{"a", {4}, 0, 0}, {"a", {4}, 0, 32}}, data), "appears twice");
  // Tensor infos that end before the data section would begin.
  auto b = image({}, {{"t", {4}, 0, 0}});
  b.resize(b.size() - 1);
  expect_bad(b, "truncated");
}

TEST(Gguf, EveryTruncationIsAnError) {
  const auto full = sample_image();
  ASSERT_EQ(parse_error(full), "");
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> b(full.begin(), full.begin() + std::ptrdiff_t(n));
    std::string msg = parse_error(b);
    ASSERT_FALSE(msg.empty()) << "a prefix of " << n << " bytes parsed";
    EXPECT_TRUE(msg.find("truncated") != std::string::npos ||
                msg.find("not a GGUF file") != std::string::npos)
        << n << ": " << msg;
  }
}

TEST(Gguf, MutatedImagesParseOrFailCleanly) {
  // Random byte flips, random u64 overwrites (corrupt counts, lengths, offsets) and
  // truncations of a valid image: each must parse or throw sf::Error; what parses must read.
  const auto seed = sample_image();
  std::mt19937_64 g(12345);
  int parsed = 0;
  for (int it = 0; it < 4000; ++it) {
    std::vector<uint8_t> b = seed;
    const int edits = 1 + int(g() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = size_t(g() % b.size());
      switch (g() % 3) {
        case 0: b[at] ^= uint8_t(1u << (g() % 8)); break;
        case 1: {
          uint64_t v = g() % 2 ? g() : g() % 256;
          std::memcpy(b.data() + at, &v, std::min<size_t>(8, b.size() - at));
          break;
        }
        default: b.resize(at + 1); break;
      }
    }
    try {
      GgufView v = GgufView::parse(b.data(), b.size(), "fuzz.gguf");
      ++parsed;
      for (auto& t : v.tensors())
        if (gguf_can_read_f32(t.type)) {
          std::vector<float> out(size_t(t.numel));
          v.read_f32(t, out.data());
        }
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::input) << e.what();
    }
  }
  EXPECT_GT(parsed, 0);  // some mutations (e.g. in tensor data) leave a valid file
}

TEST(Gguf, FileErrorsNameThePath) {
  test::TempDir dir("gguf");
  try {
    GgufFile f(dir.path / "missing.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.gguf"), std::string::npos) << e.what();
  }
  auto b = sample_image();
  b.resize(b.size() - 10);
  const fs::path p = dir.path / "cut.gguf";
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                           std::streamsize(b.size()));
  try {
    GgufFile f(p);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cut.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor \"b\""), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace sf
