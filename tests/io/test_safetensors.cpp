// io/safetensors: bit-exact round trips (single file and shards, bf16/f16/f32), a
// hand-made file with known bytes, and one test per malformed input checking the message.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "parse_refusal.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> b(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
  if (!header.empty()) std::memcpy(b.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(b.data() + 8 + header.size(), data.data(), data.size());
  return b;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Parses an in-memory image and returns the error message ("" when it parses).
std::string parse_error(const std::vector<uint8_t>& b, const std::string& src = "mem.safetensors") {
  return test::parse_error_of<SafetensorsView>(b, src);
}

// Expects the image to be refused with a message naming the source and containing `needle`.
void expect_bad(const std::vector<uint8_t>& b, const std::string& needle) {
  test::expect_parse_refused<SafetensorsView>(b, "mem.safetensors", needle);
}

std::string entry(const std::string& dtype, const std::string& shape, const std::string& off) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + off + "}";
}

std::vector<uint8_t> zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- round trips ------------------------------------------------------------------------

struct SafetensorsRoundTrip : ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, SingleFileBitExact) {
  const DType dt = GetParam();
  test::TempDir dir;
  auto a = test::random_vec(3 * 67, 1, -3.f, 3.f);
  auto b = test::random_vec(1000, 2, -1e-3f, 1e-3f);
  b[0] = 0.f;  // zero and signed zero survive too
  b[1] = -0.f;
  fs::path p = dir.path / "x.safetensors";
  uint64_t size = write_safetensors_file(
      p, {{"a", dt, {3, 67}, a.data(), nullptr}, {"b.weight", dt, {1000}, b.data(), nullptr}},
      {{"note", "hello"}});
  EXPECT_EQ(fs::file_size(p), size);

  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.view().metadata().at("format"), "pt");
  EXPECT_EQ(f.view().metadata().at("note"), "hello");
  EXPECT_EQ(f.view().gap_bytes(), 0u);
  EXPECT_EQ(f.view().data_offset() % 8, 0u);
  const TensorInfo& ta = f.get("a");
  EXPECT_EQ(ta.dtype, st_dtype_of(dt));
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{3, 67}));
  for (auto* src : {&a, &b}) {
    const TensorInfo& t = f.get(src == &a ? "a" : "b.weight");
    // Bytes: exactly what the core conversion produces.
    std::vector<uint8_t> want(src->size() * dtype_size(dt));
    convert_from_f32(src->data(), want.data(), dt, src->size());
    ASSERT_EQ(t.bytes(), want.size());
    EXPECT_EQ(std::memcmp(f.view().raw(t), want.data(), want.size()), 0);
    // Values: bit-exact after the round trip through the stored type.
    std::vector<float> got = f.read_f32(t.name);
    std::vector<float> ref(src->size());
    convert_to_f32(want.data(), dt, ref.data(), src->size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0);
    if (dt == DType::f32) {
      EXPECT_EQ(std::memcmp(got.data(), src->data(), src->size() * 4), 0);
    }
    if (dt == DType::bf16) {
      for (size_t i = 0; i < src->size(); ++i) EXPECT_EQ(got[i], round_bf16((*src)[i]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SafetensorsRoundTrip,
                         ::testing::Values(DType::bf16, DType::f16, DType::f32),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST(Safetensors, HeaderIsPaddedJsonWithMetadataAndContiguousData) {
  test::TempDir dir;
  auto v = test::random_vec(5, 3);
  fs::path p = dir.path / "x.safetensors";
  write_safetensors_file(p, {{"odd", DType::bf16, {5}, v.data(), nullptr},
                             {"next", DType::f32, {5}, v.data(), nullptr}});
  std::string s = read_file(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(s[size_t(i)])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header = s.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1 + (8 - (header.find_last_not_of(' ') + 1) % 8) % 8,
            header.size());  // only spaces pad, and only up to the next multiple of 8
  json h = json::parse(header);
  EXPECT_EQ(h["__metadata__"], json({{"format", "pt"}}));
  EXPECT_EQ(h["odd"]["data_offsets"], json({0, 10}));
  EXPECT_EQ(h["next"]["data_offsets"], json({10, 30}));  // packed: the format forbids holes
  EXPECT_EQ(s.size(), 8 + n + 30);
  // Tensors keep the given order in the header (HF readers do not care; humans do).
  EXPECT_LT(header.find("\"odd\""), header.find("\"next\""));
}

TEST(Safetensors, HandMadeFileWithKnownBytes) {
  // BF16 [1.0, -2.0], F32 scalar 0.5, F16 [1.0, -0.5]; an U8 first makes the BF16 tensor
  // start at an odd offset, which must still read (through an aligned bounce buffer).
  std::string header =
      R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[1,5]},)"
      R"("b":{"dtype":"F32","shape":[],"data_offsets":[5,9]},)"
      R"("h":{"dtype":"F16","shape":[1,2],"data_offsets":[9,13]},)"
      R"("__metadata__":{"format":"pt"}})";
  std::vector<uint8_t> data = {7,    0x80, 0x3f, 0x00, 0xc0, 0x00, 0x00,
                               0x00, 0x3f, 0x00, 0x3c, 0x00, 0xb8};
  test::TempDir dir;
  fs::path p = dir.path / "hand.safetensors";
  write_bytes(p, image(header, data));
  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "u");  // data order
  EXPECT_EQ(f.get("u").dtype, StDType::U8);
  EXPECT_EQ(f.view().raw(f.get("u"))[0], 7);
  EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(f.get("b").shape.size(), 0u);
  EXPECT_EQ(f.get("b").numel, 1);
  EXPECT_EQ(f.read_f32("b"), (std::vector<float>{0.5f}));
  EXPECT_EQ(f.read_f32("h"), (std::vector<float>{1.f, -0.5f}));
  EXPECT_EQ(f.view().gap_bytes(), 0u);
  EXPECT_TRUE(f.view().notes().empty());
}

TEST(Safetensors, ReadsAFileWrittenByHuggingFace) {
  // tests/data/hf_reference.safetensors was written by Hugging Face's safetensors 0.8.0
  // (serialize_file) from x[i] = float32((i * 37 % 101) - 50) / float32(7): BF16 rounded to
  // nearest even, F16 by numpy, F32 as is, plus an I64 buffer. Both sides round the same
  // IEEE way, so the values must agree bit for bit.
  SafetensorsFile f(test::source_dir() / "tests/data/hf_reference.safetensors");
  EXPECT_EQ(f.view().metadata().at("producer"), "safetensors 0.8.0");
  EXPECT_EQ(f.view().gap_bytes(), 0u);
  std::vector<float> x(60);
  for (int i = 0; i < 60; ++i) x[size_t(i)] = float((i * 37 % 101) - 50) / 7.f;
  const TensorInfo& up = f.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.dtype, StDType::BF16);
  EXPECT_EQ(up.shape, (std::vector<int64_t>{6, 10}));
  std::vector<float> got = f.read_f32(up.name);
  for (size_t i = 0; i < 60; ++i) EXPECT_EQ(got[i], round_bf16(x[i])) << i;
  got = f.read_f32("model.norm.weight");
  ASSERT_EQ(got.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(got[i], f16_to_f32(f32_to_f16(x[i]))) << i;
  got = f.read_f32("lm_head.weight");
  EXPECT_EQ(f.get("lm_head.weight").shape, (std::vector<int64_t>{3, 2, 5}));
  EXPECT_EQ(std::memcmp(got.data(), x.data(), 30 * 4), 0);
  const TensorInfo& ids = f.get("position_ids");
  EXPECT_EQ(ids.dtype, StDType::I64);
  std::vector<int64_t> want_ids = {0, 1, -2, 1ll << 40};
  EXPECT_EQ(std::memcmp(f.view().raw(ids), want_ids.data(), 32), 0);
}

TEST(Safetensors, BigUnalignedTensorReadsOnThePool) {
  // > 2^18 elements takes the threaded path; offset 2 in a BF16->F32 is 4-unaligned for F32.
  const size_t n = (1 << 18) + 77;
  auto v = test::random_vec(n, 4);
  std::vector<uint8_t> data(2 + n * 4);
  std::memcpy(data.data() + 2, v.data(), n * 4);
  std::string header = R"({"p":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"big":)" +
                       entry("\"F32\"", "[" + std::to_string(n) + "]",
                             "[2," + std::to_string(2 + n * 4) + "]") +
                       "}";
  auto b = image(header, data);
  auto view = SafetensorsView::parse(b.data(), b.size(), "mem");
  std::vector<float> got(n);
  view.read_f32(view.get("big"), got.data());
  EXPECT_EQ(std::memcmp(got.data(), v.data(), n * 4), 0);
}

TEST(Safetensors, ShardedModelRoundTripAndIndex) {
  test::TempDir dir;
  std::vector<std::vector<float>> src;
  std::vector<TensorWrite> ts;
  for (int i = 0; i < 7; ++i) src.push_back(test::random_vec(100 + size_t(i), 10 + uint64_t(i)));
  for (int i = 0; i < 7; ++i)
    ts.push_back({"t" + std::to_string(i), DType::bf16, {100 + i}, src[size_t(i)].data(), nullptr});
  // 450 bytes per shard: tensors of 200..212 bytes pack two per shard -> 4 shards.
  auto files = write_safetensors_model(dir.path, ts, 450);
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files[0].filename(), "model-00001-of-00004.safetensors");
  EXPECT_EQ(files[3].filename(), "model-00004-of-00004.safetensors");
  EXPECT_EQ(files[4].filename(), "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors"));
  json idx = json::parse(read_file(dir.path / "model.safetensors.index.json"));
  uint64_t total = 0;
  for (int i = 0; i < 7; ++i) total += 2 * (100 + uint64_t(i));
  EXPECT_EQ(idx["metadata"]["total_size"], total);
  EXPECT_EQ(idx["weight_map"]["t0"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["t2"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["t6"], "model-00004-of-00004.safetensors");

  SafetensorsModel m(dir.path);
  EXPECT_TRUE(m.sharded());
  EXPECT_EQ(m.size(), 7u);
  EXPECT_TRUE(m.notes().empty());
  for (int i = 0; i < 7; ++i) {
    std::vector<float> got(100 + size_t(i));
    m.read_f32("t" + std::to_string(i), got.data());
    for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], round_bf16(src[size_t(i)][k]));
  }

  // Saving again as one file removes the index and the shards (else they would be stale).
  auto one = write_safetensors_model(dir.path, ts, 1 << 20);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].filename(), "model.safetensors");
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir.path / "model-00001-of-00004.safetensors"));
  SafetensorsModel m1(dir.path);
  EXPECT_FALSE(m1.sharded());
  EXPECT_EQ(m1.size(), 7u);

  // And back to shards: the single file goes, since it would shadow the index.
  write_safetensors_model(dir.path, ts, 1000);
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path / "model-00002-of-00002.safetensors"));
  EXPECT_TRUE(SafetensorsModel(dir.path).sharded());
}

TEST(Safetensors, OversizedTensorGetsItsOwnShardAndRawBytesPassThrough) {
  test::TempDir dir;
  std::vector<int64_t> ids = {1, -2, 3, 1ll << 40};
  auto big = test::random_vec(64, 5);
  auto files = write_safetensors_model(
      dir.path,
      {{"ids", DType::i64, {4}, nullptr, ids.data()}, {"big", DType::f32, {64}, big.data(), nullptr}},
      100);
  ASSERT_EQ(files.size(), 3u);  // 32 B, then 256 B > 100 alone, then the index
  SafetensorsModel m(dir.path);
  auto e = m.get("ids");
  EXPECT_EQ(e.info->dtype, StDType::I64);
  EXPECT_EQ(std::memcmp(e.file->view().raw(*e.info), ids.data(), 32), 0);
  std::string msg = error_of([&] { m.read_f32("ids", nullptr); });
  EXPECT_NE(msg.find("only BF16, F16 and F32"), std::string::npos) << msg;
  std::vector<float> got(64);
  m.read_f32("big", got.data());
  EXPECT_EQ(got, big);
}

// ---- malformed files: one test each ------------------------------------------------------

TEST(SafetensorsBad, ShorterThan8Bytes) {
  expect_bad({}, "shorter than the 8-byte");
  expect_bad({1, 2, 3}, "shorter than the 8-byte");
}

TEST(SafetensorsBad, HeaderLengthAbsurd) {
  std::vector<uint8_t> b(16, 0xff);
  expect_bad(b, "absurdly large");
}

TEST(SafetensorsBad, HeaderLengthBeyondFile) {
  auto b = image("{}");
  b[0] = 200;
  expect_bad(b, "runs past the end of the file");
}

TEST(SafetensorsBad, HeaderNotJson) {
  expect_bad(image("{\"a\": "), "header is not valid JSON");
  expect_bad(image(""), "header is not valid JSON");
  expect_bad(image("{} trailing"), "header is not valid JSON");
  expect_bad(image("{\"a\":\"\xff\"}"), "header is not valid JSON");  // bad UTF-8
  // A NUL ends nlohmann's input: what follows it must not be silently ignored.
  expect_bad(image(std::string("{}\0garbage", 10)), "a NUL byte at header offset 2");
  expect_bad(image(std::string("{}  \0", 5)), "headers may only be padded with spaces");
  EXPECT_EQ(parse_error(image("{}  \n\t ")), "");  // JSON whitespace is fine (HF's reader agrees)
}

TEST(SafetensorsBad, HeaderNotObject) {
  expect_bad(image("[1,2]"), "header must be a JSON object, got an array");
  expect_bad(image("42"), "header must be a JSON object");
}

TEST(SafetensorsBad, EntryNotObject) {
  expect_bad(image(R"({"w":[1]})"), "tensor \"w\" must be an object");
}

TEST(SafetensorsBad, MissingFields) {
  expect_bad(image(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", zeros(4)),
             "tensor \"w\" has no \"dtype\" field");
  expect_bad(image(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", zeros(4)),
             "tensor \"w\" has no \"shape\" field");
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[1]}})", zeros(4)),
             "tensor \"w\" has no \"data_offsets\" field");
}

TEST(SafetensorsBad, WrongFieldTypes) {
  expect_bad(image("{\"w\":" + entry("5", "[1]", "[0,4]") + "}", zeros(4)),
             "\"dtype\" must be a string");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "4", "[0,4]") + "}", zeros(4)),
             "\"shape\" must be an array");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1.5]", "[0,4]") + "}", zeros(4)),
             "\"shape\"[0] must be an integer");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[\"1\"]", "[0,4]") + "}", zeros(4)),
             "\"shape\"[0] must be an integer");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1]", "{}") + "}", zeros(4)),
             "\"data_offsets\" must be an array [begin, end]");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1]", "[0,4,8]") + "}", zeros(8)),
             "\"data_offsets\" must be an array [begin, end]");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1]", "[0,4.0]") + "}", zeros(4)),
             "\"data_offsets\"[1] must be a non-negative integer");
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1]", "[-4,0]") + "}", zeros(4)),
             "\"data_offsets\"[0] must be a non-negative integer");
}

TEST(SafetensorsBad, UnknownDtype) {
  expect_bad(image("{\"w\":" + entry("\"F128\"", "[1]", "[0,16]") + "}", zeros(16)),
             "unknown dtype \"F128\"");
}

TEST(SafetensorsBad, NegativeShape) {
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[2,-1]", "[0,4]") + "}", zeros(4)),
             "\"shape\"[1] is negative");
}

TEST(SafetensorsBad, OverflowingShape) {
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[4294967296,4294967296]", "[0,4]") + "}",
                   zeros(4)),
             "more elements than fit in 64 bits");
  // numel fits but numel * 4 bytes does not.
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[4611686018427387904]", "[0,4]") + "}",
                   zeros(4)),
             "more elements than fit in 64 bits");
  expect_bad(image("{\"w\":" + entry("\"U8\"", "[18446744073709551615]", "[0,4]") + "}",
                   zeros(4)),
             "is too large");
}

TEST(SafetensorsBad, OffsetsBeginAfterEnd) {
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[1]", "[8,4]") + "}", zeros(8)),
             "has begin > end");
}

TEST(SafetensorsBad, EndBeyondData) {
  expect_bad(image("{\"w\":" + entry("\"F32\"", "[2]", "[0,8]") + "}", zeros(7)),
             "end beyond the data section (7 bytes)");
}

TEST(SafetensorsBad, ByteSizeNotNumelTimesDtype) {
  expect_bad(image("{\"w\":" + entry("\"BF16\"", "[3]", "[0,8]") + "}", zeros(8)),
             "span 8 bytes but shape [3] of BF16 needs 6 bytes");
}

TEST(SafetensorsBad, OverlappingTensors) {
  std::string h = "{\"a\":" + entry("\"F32\"", "[2]", "[0,8]") +
                  ",\"b\":" + entry("\"F32\"", "[1]", "[4,8]") + "}";
  expect_bad(image(h, zeros(8)), "overlap");
  // Same range twice.
  h = "{\"a\":" + entry("\"F32\"", "[1]", "[0,4]") + ",\"b\":" + entry("\"I32\"", "[1]", "[0,4]") +
      "}";
  expect_bad(image(h, zeros(4)), "overlap");
}

// Stricter than HF's reader, which lets the last duplicate win: a header naming a tensor
// twice is corrupt or crafted, and which copy is meant cannot be known.
TEST(SafetensorsBad, DuplicateTensorName) {
  std::string h = "{\"a\":" + entry("\"F32\"", "[1]", "[0,4]") +
                  ",\"a\":" + entry("\"F32\"", "[1]", "[4,8]") + "}";
  expect_bad(image(h, zeros(8)), "key \"a\" appears twice");
}

TEST(SafetensorsBad, BadMetadata) {
  expect_bad(image(R"({"__metadata__":[1]})"), "\"__metadata__\" must be an object of strings");
  expect_bad(image(R"({"__metadata__":{"format":1}})"),
             "\"__metadata__\" value \"format\" must be a string");
}

TEST(SafetensorsBad, DeepNesting) {
  std::string h = "{\"__metadata__\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_bad(image(h), "nests deeper than");
}

TEST(Safetensors, GapsAreAllowedButNoted) {
  std::string h = "{\"a\":" + entry("\"F32\"", "[1]", "[0,4]") +
                  ",\"b\":" + entry("\"F32\"", "[1]", "[8,12]") + "}";
  auto b = image(h, zeros(16));
  auto v = SafetensorsView::parse(b.data(), b.size(), "mem");
  EXPECT_EQ(v.gap_bytes(), 8u);  // [4,8) and [12,16)
  ASSERT_EQ(v.notes().size(), 1u);
  EXPECT_NE(v.notes()[0].find("belong to no tensor"), std::string::npos);
}

TEST(Safetensors, EmptyTensorsAndEmptyHeader) {
  auto b = image("{}");
  EXPECT_EQ(SafetensorsView::parse(b.data(), b.size(), "mem").tensors().size(), 0u);
  // A zero-size tensor may sit anywhere, even inside another.
  std::string h = "{\"a\":" + entry("\"F32\"", "[2]", "[0,8]") +
                  ",\"e\":" + entry("\"F32\"", "[0,5]", "[4,4]") + "}";
  auto b2 = image(h, zeros(8));
  auto v = SafetensorsView::parse(b2.data(), b2.size(), "mem");
  EXPECT_EQ(v.get("e").numel, 0);
  EXPECT_TRUE(v.read_f32("e").empty());
}

TEST(Safetensors, UnknownNameAndFileErrors) {
  auto b = image("{}");
  auto v = SafetensorsView::parse(b.data(), b.size(), "mem.safetensors");
  std::string msg = error_of([&] { v.get("nope"); });
  EXPECT_NE(msg.find("mem.safetensors: no tensor named \"nope\""), std::string::npos) << msg;

  test::TempDir dir;
  msg = error_of([&] { SafetensorsFile f(dir.path / "absent.safetensors"); });
  EXPECT_NE(msg.find("absent.safetensors: cannot open"), std::string::npos) << msg;
  write_bytes(dir.path / "empty.safetensors", {});
  msg = error_of([&] { SafetensorsFile f(dir.path / "empty.safetensors"); });
  EXPECT_NE(msg.find("empty.safetensors: file is 0 bytes, shorter than"), std::string::npos)
      << msg;
  // A truncated real file: the last tensor now ends beyond the data.
  auto v1 = test::random_vec(16, 6);
  fs::path p = dir.path / "trunc.safetensors";
  write_safetensors_file(p, {{"w", DType::f32, {16}, v1.data(), nullptr}});
  fs::resize_file(p, fs::file_size(p) - 1);
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find("trunc.safetensors: tensor \"w\": data_offsets [0, 64] end beyond"),
            std::string::npos)
      << msg;
}

// ---- model directories -----------------------------------------------------------------

struct ShardedDir {
  test::TempDir dir;
  std::vector<float> v = test::random_vec(8, 7);
  ShardedDir() {
    write_safetensors_model(dir.path,
                            {{"a", DType::f32, {8}, v.data(), nullptr},
                             {"b", DType::f32, {8}, v.data(), nullptr},
                             {"c", DType::f32, {8}, v.data(), nullptr}},
                            70);  // 32 B each: shards {a, b} and {c}
  }
  fs::path index() const { return dir.path / "model.safetensors.index.json"; }
  json read_index() const { return json::parse(read_file(index())); }
  void write_index(const json& j) const { write_file_atomic(index(), j.dump()); }
  std::string open_error() const {
    return error_of([&] { SafetensorsModel m(dir.path); });
  }
};

TEST(SafetensorsModelBad, NoWeights) {
  test::TempDir dir;
  std::string msg = error_of([&] { SafetensorsModel m(dir.path); });
  EXPECT_NE(msg.find("no model.safetensors or model.safetensors.index.json"), std::string::npos)
      << msg;
  write_file_atomic(dir.path / "pytorch_model.bin", "x");
  msg = error_of([&] { SafetensorsModel m(dir.path); });
  EXPECT_NE(msg.find("PyTorch .bin"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsModel m(dir.path / "nothing"); });
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
}

TEST(SafetensorsModelBad, MissingShard) {
  ShardedDir d;
  fs::remove(d.dir.path / "model-00002-of-00002.safetensors");
  std::string msg = d.open_error();
  EXPECT_NE(msg.find("shard \"model-00002-of-00002.safetensors\" (named in weight_map) does not "
                     "exist"),
            std::string::npos)
      << msg;
}

TEST(SafetensorsModelBad, NameMappedToShardLackingIt) {
  ShardedDir d;
  json j = d.read_index();
  j["weight_map"]["a"] = "model-00002-of-00002.safetensors";
  d.write_index(j);
  std::string msg = d.open_error();
  EXPECT_NE(msg.find("weight_map puts tensor \"a\" in \"model-00002-of-00002.safetensors\", but "
                     "that shard has no such tensor (it is in model-00001-of-00002.safetensors)"),
            std::string::npos)
      << msg;
  j["weight_map"]["zzz"] = "model-00002-of-00002.safetensors";
  j["weight_map"]["a"] = "model-00001-of-00002.safetensors";
  d.write_index(j);
  msg = d.open_error();
  EXPECT_NE(msg.find("tensor \"zzz\""), std::string::npos) << msg;
}

TEST(SafetensorsModelBad, DuplicateAcrossShards) {
  ShardedDir d;
  fs::copy_file(d.dir.path / "model-00001-of-00002.safetensors",
                d.dir.path / "model-00002-of-00002.safetensors",
                fs::copy_options::overwrite_existing);
  std::string msg = d.open_error();
  EXPECT_NE(msg.find("tensor \"a\" is in two shards"), std::string::npos) << msg;
}

TEST(SafetensorsModelBad, BadIndex) {
  ShardedDir d;
  write_file_atomic(d.index(), "{not json");
  EXPECT_NE(d.open_error().find("index.json is not valid JSON"), std::string::npos)
      << d.open_error();
  d.write_index(json{{"metadata", json::object()}});
  EXPECT_NE(d.open_error().find("has no \"weight_map\""), std::string::npos) << d.open_error();
  d.write_index(json{{"weight_map", {{"a", 3}}}});
  EXPECT_NE(d.open_error().find("weight_map[\"a\"] must be a file name string"),
            std::string::npos)
      << d.open_error();
  d.write_index(json{{"weight_map", {{"a", "../model-00001-of-00002.safetensors"}}}});
  EXPECT_NE(d.open_error().find("is not a plain file name"), std::string::npos)
      << d.open_error();
}

TEST(SafetensorsModel, UnindexedTensorIsNoted) {
  ShardedDir d;
  json j = d.read_index();
  j["weight_map"].erase("b");
  d.write_index(j);
  SafetensorsModel m(d.dir.path);
  EXPECT_EQ(m.size(), 3u);
  ASSERT_EQ(m.notes().size(), 1u);
  EXPECT_NE(m.notes()[0].find("\"b\""), std::string::npos);
}

TEST(SafetensorsModel, SingleFileWinsOverIndex) {
  ShardedDir d;
  auto v = test::random_vec(3, 8);
  write_safetensors_file(d.dir.path / "model.safetensors", {{"x", DType::f32, {3}, v.data(), nullptr}});
  SafetensorsModel m(d.dir.path);
  EXPECT_FALSE(m.sharded());
  EXPECT_EQ(m.names(), std::vector<std::string>{"x"});
}

TEST(SafetensorsWriteBad, InvalidTensors) {
  test::TempDir dir;
  auto v = test::random_vec(4, 9);
  fs::path p = dir.path / "w.safetensors";
  auto msg = error_of([&] {
    write_safetensors_file(p, {{"a", DType::f32, {4}, v.data(), nullptr},
                               {"a", DType::f32, {4}, v.data(), nullptr}});
  });
  EXPECT_NE(msg.find("tensor \"a\" is given twice"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors_file(p, {{"a", DType::f32, {-4}, v.data(), nullptr}}); });
  EXPECT_NE(msg.find("negative dimension"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors_file(p, {{"a", DType::f32, {4}, nullptr, nullptr}}); });
  EXPECT_NE(msg.find("needs exactly one source"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors_file(p, {{"a", DType::i32, {4}, v.data(), nullptr}}); });
  EXPECT_NE(msg.find("an fp32 source can be stored as f32, bf16 or f16"), std::string::npos)
      << msg;
  msg = error_of([&] { write_safetensors_file(p, {{"bad\xff", DType::f32, {4}, v.data(), nullptr}}); });
  EXPECT_NE(msg.find("must be UTF-8"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors_model(dir.path / "m", {}, 100); });
  EXPECT_NE(msg.find("no tensors to write"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(p));  // nothing half-written
}

}  // namespace
}  // namespace sf
