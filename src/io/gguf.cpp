#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

// The dequantization below computes what numpy computes, operation by operation, with
// float32 roundings in between: src/CMakeLists.txt compiles this file with
// -ffp-contract=off (no fused multiply-add may merge d * q into + m).
static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace sf {

namespace {

// A name as it appears in a message: quoted, and cut short if a corrupt file made it huge.
std::string q(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out;
  for (char c : s.substr(0, kMax)) {
    // Corrupt names may hold control bytes: keep messages printable.
    if (uint8_t(c) < 0x20 || c == 0x7f) out += cat("\\x", "0123456789abcdef"[uint8_t(c) >> 4],
                                                   "0123456789abcdef"[uint8_t(c) & 15]);
    else out += c;
  }
  if (s.size() <= kMax) return cat('"', out, '"');
  return cat('"', out, "...\" (", s.size(), " bytes)");
}

// Element sizes of the metadata value types (0: string and array, which have none).
size_t value_size(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    case GgufType::string: case GgufType::array: return 0;
  }
  return 0;
}

bool known_value_type(uint32_t t) { return t <= uint32_t(GgufType::f64); }

// ggml's tensor types: id, name, elements per block, bytes per block (ggml.h / ggml.c).
struct TensorTypeRow {
  uint32_t id;
  const char* name;
  uint32_t block, bytes;
};
constexpr TensorTypeRow kTensorTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},
    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},    {14, "Q6_K", 256, 210},
    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},
    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},
    {24, "I8", 1, 1},         {25, "I16", 1, 2},         {26, "I32", 1, 4},
    {27, "I64", 1, 8},        {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},
    {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},     {41, "Q1_0", 128, 18},
};

const TensorTypeRow* tensor_type(uint32_t id) {
  for (auto& r : kTensorTypes)
    if (r.id == id) return &r;
  return nullptr;
}

uint16_t le16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

constexpr uint32_t kMaxTensorDims = 4;          // the format's current limit
constexpr size_t kMaxTensorName = 64;           // the format's limit (GGML_MAX_NAME)
constexpr size_t kMaxKeyBytes = 65535;          // the format's limit for keys
constexpr int kMaxArrayDepth = 8;               // arrays of arrays; bounds the recursion
constexpr int64_t kMaxNumel = int64_t(1) << 56;  // keeps numel and byte sizes far from overflow

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "uint8";
    case GgufType::i8: return "int8";
    case GgufType::u16: return "uint16";
    case GgufType::i16: return "int16";
    case GgufType::u32: return "uint32";
    case GgufType::i32: return "int32";
    case GgufType::f32: return "float32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "uint64";
    case GgufType::i64: return "int64";
    case GgufType::f64: return "float64";
  }
  return "?";
}

std::string gguf_tensor_type_name(uint32_t id) {
  if (const TensorTypeRow* r = tensor_type(id)) return r->name;
  return cat("type ", id, " (unknown)");
}

bool gguf_can_read_f32(uint32_t t) {
  return t == ggml_type::F32 || t == ggml_type::F16 || t == ggml_type::BF16 ||
         t == ggml_type::Q8_0 || t == ggml_type::Q4_1;
}

std::optional<uint64_t> gguf_tensor_bytes(uint32_t id, int64_t ne0, int64_t numel) {
  const TensorTypeRow* r = tensor_type(id);
  if (!r || ne0 <= 0 || numel < 0 || ne0 % int64_t(r->block) != 0 || numel % ne0 != 0)
    return std::nullopt;
  return uint64_t(numel) / r->block * r->bytes;
}

// ---- GgufValue ------------------------------------------------------------------------------

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16:
    case GgufType::u32: case GgufType::i32: case GgufType::u64: case GgufType::i64: return true;
    default: return false;
  }
}

bool GgufValue::is_number() const {
  return is_integer() || type_ == GgufType::f32 || type_ == GgufType::f64;
}

namespace {

// The value of one element of `t` from its raw bits (zero-extended little-endian).
bool bits_to_int(GgufType t, uint64_t b, int64_t& out) {
  switch (t) {
    case GgufType::u8: case GgufType::u16: case GgufType::u32: out = int64_t(b); return true;
    case GgufType::u64:
      if (b > uint64_t(std::numeric_limits<int64_t>::max())) return false;
      out = int64_t(b);
      return true;
    case GgufType::i8: out = int8_t(uint8_t(b)); return true;
    case GgufType::i16: out = int16_t(uint16_t(b)); return true;
    case GgufType::i32: out = int32_t(uint32_t(b)); return true;
    case GgufType::i64: out = int64_t(b); return true;
    default: return false;
  }
}

bool bits_to_double(GgufType t, uint64_t b, double& out) {
  if (t == GgufType::f32) {
    uint32_t u = uint32_t(b);
    float f;
    std::memcpy(&f, &u, 4);
    out = f;
    return true;
  }
  if (t == GgufType::f64) {
    std::memcpy(&out, &b, 8);
    return true;
  }
  if (t == GgufType::u64) {
    out = double(b);
    return true;
  }
  int64_t i;
  if (!bits_to_int(t, b, i)) return false;
  out = double(i);
  return true;
}

}  // namespace

int64_t GgufValue::as_int(std::string_view what) const {
  int64_t v;
  SF_REQUIRE(bits_to_int(type_, bits_, v), q(what), " must be an integer that fits in int64, got ",
             describe());
  return v;
}

double GgufValue::as_double(std::string_view what) const {
  double v;
  SF_REQUIRE(bits_to_double(type_, bits_, v), q(what), " must be a number, got ", describe());
  return v;
}

bool GgufValue::as_bool(std::string_view what) const {
  SF_REQUIRE(type_ == GgufType::boolean, q(what), " must be a bool, got ", describe());
  return bits_ != 0;
}

const std::string& GgufValue::as_string(std::string_view what) const {
  SF_REQUIRE(type_ == GgufType::string, q(what), " must be a string, got ", describe());
  return str_;
}

size_t GgufValue::size() const { return type_ == GgufType::array ? size_t(count_) : 0; }

int64_t GgufValue::int_at(size_t i, std::string_view what) const {
  SF_REQUIRE(is_array() && i < count_, q(what), "[", i, "]: out of range (", describe(), ")");
  const size_t es = value_size(elem_);
  SF_REQUIRE(es > 0 && elem_ != GgufType::boolean && elem_ != GgufType::f32 &&
                 elem_ != GgufType::f64,
             q(what), " must be an array of integers, got ", describe());
  uint64_t b = 0;
  std::memcpy(&b, raw_.data() + i * es, es);
  int64_t v;
  SF_REQUIRE(bits_to_int(elem_, b, v), q(what), "[", i, "] does not fit in int64");
  return v;
}

double GgufValue::double_at(size_t i, std::string_view what) const {
  SF_REQUIRE(is_array() && i < count_, q(what), "[", i, "]: out of range (", describe(), ")");
  const size_t es = value_size(elem_);
  SF_REQUIRE(es > 0 && elem_ != GgufType::boolean, q(what), " must be an array of numbers, got ",
             describe());
  uint64_t b = 0;
  std::memcpy(&b, raw_.data() + i * es, es);
  double v;
  bits_to_double(elem_, b, v);
  return v;
}

const std::string& GgufValue::string_at(size_t i, std::string_view what) const {
  SF_REQUIRE(is_array() && elem_ == GgufType::string, q(what),
             " must be an array of strings, got ", describe());
  SF_REQUIRE(i < strs_.size(), q(what), "[", i, "]: out of range (", describe(), ")");
  return strs_[i];
}

const GgufValue& GgufValue::array_at(size_t i, std::string_view what) const {
  SF_REQUIRE(is_array() && elem_ == GgufType::array, q(what),
             " must be an array of arrays, got ", describe());
  SF_REQUIRE(i < arrs_.size(), q(what), "[", i, "]: out of range (", describe(), ")");
  return arrs_[i];
}

std::string GgufValue::describe() const {
  switch (type_) {
    case GgufType::string: return cat("string ", q(str_));
    case GgufType::array: return cat("array of ", count_, " ", gguf_type_name(elem_));
    case GgufType::boolean: return bits_ ? "bool true" : "bool false";
    case GgufType::f32: case GgufType::f64: {
      double d = 0;
      bits_to_double(type_, bits_, d);
      return cat(gguf_type_name(type_), " ", d);
    }
    default: {
      if (type_ == GgufType::u64) return cat("uint64 ", bits_);
      int64_t i = 0;
      bits_to_int(type_, bits_, i);
      return cat(gguf_type_name(type_), " ", i);
    }
  }
}

// ---- parsing --------------------------------------------------------------------------------

struct GgufParser {
  const uint8_t* data;
  size_t size;
  const std::string& src;
  size_t pos = 0;

  // `what` arguments are callables returning the description, so that the hot path (100k
  // vocabulary strings) builds no message text unless something is wrong.
  size_t remain() const { return size - pos; }

  template <class W>
  void need(uint64_t n, const W& what) const {
    if (n > remain())
      SF_FAIL(input, src, ": truncated or corrupt GGUF: ", what(), " at byte ", pos, " needs ",
              n, " bytes but only ", remain(), " remain (file size ", size,
              "); the file may be incomplete: download it again");
  }
  template <class W>
  uint64_t uint(size_t n, const W& what) {
    need(n, what);
    uint64_t v = 0;
    std::memcpy(&v, data + pos, n);
    pos += n;
    return v;
  }
  template <class W>
  uint32_t u32(const W& what) { return uint32_t(uint(4, what)); }
  template <class W>
  uint64_t u64(const W& what) { return uint(8, what); }

  // A string: u64 length + bytes. `max` bounds legal lengths (0: only what the file holds).
  template <class W>
  std::string string(const W& what, uint64_t max = 0) {
    const size_t at = pos;
    uint64_t n = u64([&] { return what() + " (its length)"; });
    if (max && n > max)
      SF_FAIL(input, src, ": corrupt GGUF: ", what(), " at byte ", at, " claims ", n,
              " bytes; the format allows at most ", max);
    need(n, [&] { return cat(what(), " (", n, " bytes)"); });
    std::string s(reinterpret_cast<const char*>(data + pos), size_t(n));
    pos += size_t(n);
    return s;
  }

  // Checks that `count` elements of at least `min_bytes` each can fit in what remains (so a
  // corrupt count never drives an allocation), before anything is reserved.
  void check_count(uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (min_bytes && count > remain() / min_bytes)
      SF_FAIL(input, src, ": truncated or corrupt GGUF: ", what, " claims ", count,
              " elements of at least ",
              min_bytes, " bytes each at byte ", pos, " but only ", remain(),
              " bytes remain");
  }

  GgufType value_type(const std::string& what) {
    const size_t at = pos;
    uint32_t t = u32([&] { return what; });
    if (!known_value_type(t))
      SF_FAIL(input, src, ": corrupt GGUF: ", what, " at byte ", at, " is ", t,
              ", not a GGUF value type (0..12)");
    return GgufType(t);
  }

  void value(GgufValue& v, GgufType t, const std::string& what, int depth) {
    auto w = [&] { return what; };
    v.type_ = t;
    if (t == GgufType::string) {
      v.str_ = string(w);
      return;
    }
    if (t != GgufType::array) {
      const size_t at = pos;
      v.bits_ = uint(value_size(t), w);
      if (t == GgufType::boolean && v.bits_ > 1)
        SF_FAIL(input, src, ": corrupt GGUF: ", what, " at byte ", at, " is a bool of value ",
                v.bits_, " (must be 0 or 1)");
      return;
    }
    if (depth >= kMaxArrayDepth)
      SF_FAIL(input, src, ": corrupt GGUF: ", what, " nests arrays deeper than ", kMaxArrayDepth);
    v.elem_ = value_type(what + " (its element type)");
    v.count_ = u64([&] { return what + " (its element count)"; });
    const std::string ewhat = cat(what, " (array of ", v.count_, " ", gguf_type_name(v.elem_), ")");
    if (v.elem_ == GgufType::string) {
      check_count(v.count_, 8, ewhat);
      v.strs_.reserve(size_t(v.count_));
      for (uint64_t i = 0; i < v.count_; ++i)
        v.strs_.push_back(string([&] { return cat(what, "[", i, "]"); }));
    } else if (v.elem_ == GgufType::array) {
      check_count(v.count_, 12, ewhat);
      v.arrs_.resize(size_t(v.count_));
      for (uint64_t i = 0; i < v.count_; ++i)
        value(v.arrs_[size_t(i)], GgufType::array, cat(what, "[", i, "]"), depth + 1);
    } else {
      const size_t es = value_size(v.elem_);
      check_count(v.count_, es, ewhat);
      const size_t n = size_t(v.count_) * es;
      need(n, [&] { return ewhat; });
      v.raw_.assign(data + pos, data + pos + n);
      if (v.elem_ == GgufType::boolean)
        for (size_t i = 0; i < n; ++i)
          if (v.raw_[i] > 1)
            SF_FAIL(input, src, ": corrupt GGUF: ", what, "[", i, "] at byte ", pos + i,
                    " is a bool of value ", int(v.raw_[i]), " (must be 0 or 1)");
      pos += n;
    }
  }

  GgufView parse() {
    GgufView g;
    g.data_ = data;
    g.size_ = size;
    g.source_ = src;
    if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
      SF_FAIL(input, src, ": not a GGUF file (it does not begin with the bytes \"GGUF\")");
    pos = 4;
    const uint32_t version = u32([] { return std::string("the version"); });
    if (version == 1)
      SF_FAIL(input, src, ": GGUF version 1 is not supported (only 2 and 3); convert the "
                          "model again with a current llama.cpp");
    if (version != 2 && version != 3) {
      if (version > 0xffff && (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3))
        SF_FAIL(input, src, ": a big-endian GGUF file; only little-endian files are supported");
      SF_FAIL(input, src, ": GGUF version ", version, " is not supported (only 2 and 3)");
    }
    g.version_ = version;
    const uint64_t n_tensors = u64([] { return std::string("the tensor count"); });
    const uint64_t n_kv = u64([] { return std::string("the metadata key/value count"); });
    // Smallest possible entries: a key of 1 byte + type + a 1-byte value; a tensor info with
    // a 1-byte name, no dims, type and offset.
    check_count(n_kv, 8 + 1 + 4 + 1, "the metadata key/value count");
    check_count(n_tensors, 8 + 1 + 4 + 4 + 8, "the tensor count");

    g.kvs_.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
      const size_t at = pos;
      GgufKV kv;
      kv.key = string([&] { return cat("metadata key ", i); }, kMaxKeyBytes);
      if (kv.key.empty())
        SF_FAIL(input, src, ": corrupt GGUF: metadata key ", i, " at byte ", at, " is empty");
      const std::string what = cat("metadata ", q(kv.key));
      GgufType t = value_type(what + " (its type)");
      value(kv.value, t, what, 0);
      if (!g.kv_index_.emplace(kv.key, g.kvs_.size()).second)
        SF_FAIL(input, src, ": corrupt GGUF: metadata key ", q(kv.key), " appears twice");
      g.kvs_.push_back(std::move(kv));
    }

    if (const GgufValue* a = g.find("general.alignment")) {
      SF_REQUIRE(a->type() == GgufType::u32, src, ": metadata \"general.alignment\" must be a "
                 "uint32, got ", a->describe());
      const uint64_t al = a->bits_;
      SF_REQUIRE(al > 0 && (al & (al - 1)) == 0, src, ": metadata \"general.alignment\" is ", al,
                 "; it must be a power of two");
      g.alignment_ = al;
    }

    g.tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const size_t at = pos;
      GgufTensorInfo t;
      t.name = string([&] { return cat("the name of tensor ", i); }, kMaxTensorName);
      if (t.name.empty())
        SF_FAIL(input, src, ": corrupt GGUF: tensor ", i, " at byte ", at, " has an empty name");
      const std::string what = cat("tensor ", q(t.name));
      const uint32_t n_dims = u32([&] { return what + " (its dimension count)"; });
      if (n_dims > kMaxTensorDims)
        SF_FAIL(input, src, ": corrupt GGUF: ", what, " has ", n_dims,
                " dimensions; the format allows at most ", kMaxTensorDims);
      t.numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t ne = u64([&] { return cat(what, " (dimension ", d, ")"); });
        if (ne > uint64_t(kMaxNumel) || (ne && uint64_t(t.numel) > uint64_t(kMaxNumel) / ne))
          SF_FAIL(input, src, ": corrupt GGUF: ", what, " has dimension ", d, " = ", ne,
                  ", too large (the element count would exceed 2^56)");
        t.dims.push_back(int64_t(ne));
        t.numel *= int64_t(ne);
      }
      t.type = u32([&] { return what + " (its type)"; });
      const TensorTypeRow* tt = tensor_type(t.type);
      if (!tt)
        SF_FAIL(input, src, ": ", what, " has ggml type id ", t.type,
                ", which this reader does not know");
      const int64_t ne0 = t.dims.empty() ? 1 : t.dims[0];
      if (ne0 % int64_t(tt->block) != 0)
        SF_FAIL(input, src, ": corrupt GGUF: ", what, " of type ", tt->name, " has rows of ", ne0,
                " elements, not a multiple of its block size ", tt->block);
      t.bytes = uint64_t(t.numel) / tt->block * tt->bytes;  // < 2^56 * 8: no overflow
      t.offset = u64([&] { return what + " (its data offset)"; });
      if (t.offset % g.alignment_ != 0)
        SF_FAIL(input, src, ": corrupt GGUF: ", what, " has data offset ", t.offset,
                ", not a multiple of the alignment ", g.alignment_);
      if (!g.tensor_index_.emplace(t.name, g.tensors_.size()).second)
        SF_FAIL(input, src, ": corrupt GGUF: tensor name ", q(t.name), " appears twice");
      g.tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t al = g.alignment_;
    const uint64_t pad = (al - uint64_t(pos) % al) % al;
    g.data_offset_ = uint64_t(pos) + pad;
    if (g.tensors_.empty()) return g;
    if (g.data_offset_ > size)
      SF_FAIL(input, src, ": truncated GGUF: the tensor data should start at byte ",
              g.data_offset_, " but the file has only ", size,
              " bytes; the file may be incomplete: download it again");
    const uint64_t data_bytes = size - g.data_offset_;
    std::vector<size_t> order(g.tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (auto& t : g.tensors_)
      if (t.offset > data_bytes || t.bytes > data_bytes - t.offset)
        SF_FAIL(input, src, ": truncated or corrupt GGUF: tensor ", q(t.name), " (",
                gguf_tensor_type_name(t.type), ", ", t.bytes, " bytes at data offset ", t.offset,
                ") ends past the end of the file (", data_bytes,
                " bytes of tensor data); the file may be incomplete: download it again");
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return g.tensors_[a].offset < g.tensors_[b].offset;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const auto& p = g.tensors_[order[i - 1]];
      const auto& t = g.tensors_[order[i]];
      if (p.offset + p.bytes > t.offset)
        SF_FAIL(input, src, ": corrupt GGUF: the data of tensors ", q(p.name), " and ",
                q(t.name), " overlap (offsets ", p.offset, " + ", p.bytes, " bytes and ",
                t.offset, ")");
    }
    return g;
  }
};

GgufView GgufView::parse(const uint8_t* data, size_t size, std::string source) {
  SF_CHECK(data || size == 0, "GgufView::parse of a null buffer");
  static const uint8_t empty[1] = {0};
  GgufParser p{data ? data : empty, size, source};
  return p.parse();
}

const GgufValue* GgufView::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufValue& GgufView::get(std::string_view key) const {
  const GgufValue* v = find(key);
  SF_REQUIRE(v, source_, ": has no metadata key ", q(key));
  return *v;
}

const GgufTensorInfo* GgufView::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufView::get_tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  SF_REQUIRE(t, source_, ": has no tensor ", q(name));
  return *t;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return {dims.rbegin(), dims.rend()}; }

// ---- dequantization -------------------------------------------------------------------------

namespace {

// Block formats (ggml): Q8_0 = f16 d, 32 x int8 q; value d * q.
// Q4_1 = f16 d, f16 m, 16 bytes: element j < 16 is the low nibble of byte j, element j + 16
// its high nibble; value (d * q) + m.
void dequant_q8_0(const uint8_t* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = src + b * 34;
    const float d = f16_to_f32(le16(p));
    float* o = dst + b * 32;
    for (int j = 0; j < 32; ++j) o[j] = float(int8_t(p[2 + j])) * d;
  }
}

void dequant_q4_1(const uint8_t* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = src + b * 20;
    const float d = f16_to_f32(le16(p));
    const float m = f16_to_f32(le16(p + 2));
    float* o = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      o[j] = d * float(p[4 + j] & 0x0f) + m;  // two roundings: no contraction in this file
      o[j + 16] = d * float(p[4 + j] >> 4) + m;
    }
  }
}

}  // namespace

void gguf_dequantize(const uint8_t* src, uint32_t type, float* dst, int64_t n,
                     std::string_view what) {
  SF_REQUIRE(gguf_can_read_f32(type), q(what), " has type ", gguf_tensor_type_name(type),
             "; only F32, F16, BF16, Q8_0 and Q4_1 tensors can be read (re-quantize the model "
             "to one of these, e.g. with llama.cpp's llama-quantize)");
  const TensorTypeRow* tt = tensor_type(type);
  SF_CHECK(n >= 0 && n % tt->block == 0, "dequantize of ", n, " elements, not whole blocks");
  const int64_t blocks = n / tt->block;
  switch (type) {
    case ggml_type::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case ggml_type::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(le16(src + 2 * i));
      break;
    case ggml_type::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(le16(src + 2 * i));
      break;
    case ggml_type::Q8_0: dequant_q8_0(src, dst, blocks); break;
    case ggml_type::Q4_1: dequant_q4_1(src, dst, blocks); break;
  }
}

void GgufView::read_f32(const GgufTensorInfo& t, float* dst) const {
  SF_REQUIRE(gguf_can_read_f32(t.type), source_, ": tensor ", q(t.name), " has type ",
             gguf_tensor_type_name(t.type),
             "; only F32, F16, BF16, Q8_0 and Q4_1 tensors can be read (re-quantize the model "
             "to one of these, e.g. with llama.cpp's llama-quantize)");
  SF_CHECK(data_offset_ + t.offset + t.bytes <= size_, "tensor not from this view");
  const TensorTypeRow* tt = tensor_type(t.type);
  const int64_t block = tt->block, blocks = t.numel / block;
  const uint8_t* src = raw(t);
  auto run = [&](int64_t b, int64_t e) {  // blocks [b, e)
    gguf_dequantize(src + size_t(b) * tt->bytes, t.type, dst + b * block, (e - b) * block,
                    t.name);
  };
  constexpr int64_t kParallelMin = 1 << 18;  // elements; below this threads cost more
  if (t.numel >= kParallelMin)
    host_pool().parallel_for(blocks, run, std::max<int64_t>(1, 8192 / block));
  else if (blocks > 0)
    run(0, blocks);
}

std::vector<float> GgufView::read_f32(std::string_view name) const {
  const GgufTensorInfo& t = get_tensor(name);
  SF_REQUIRE(gguf_can_read_f32(t.type), source_, ": tensor ", q(t.name), " has type ",
             gguf_tensor_type_name(t.type),
             "; only F32, F16, BF16, Q8_0 and Q4_1 tensors can be read");
  std::vector<float> out(size_t(t.numel));
  read_f32(t, out.data());
  return out;
}

// ---- GgufFile -------------------------------------------------------------------------------

GgufFile::GgufFile(const std::filesystem::path& path)
    : file_(path), view_(GgufView::parse(file_.data(), file_.size(), path.string())) {}

}  // namespace sf
