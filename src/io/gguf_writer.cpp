#include "io/gguf_writer.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"  // shape_str

namespace sf {

namespace {

constexpr uint32_t kVersion = 3;
constexpr size_t kMaxTensorName = 63;  // GGML_MAX_NAME (64) with its NUL

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
  s.append(b, sizeof(T));
}

void put_string(std::string& s, std::string_view v) {
  put<uint64_t>(s, v.size());
  s.append(v);
}

template <class T>
std::string encode_array(GgufType elem, const std::vector<T>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(elem));
  put<uint64_t>(s, v.size());
  for (const T& x : v) put<T>(s, x);
  return s;
}

uint64_t align_up(uint64_t n) {
  return (n + kGgufDefaultAlignment - 1) / kGgufDefaultAlignment * kGgufDefaultAlignment;
}

void encode_q8_0(const float* src, uint8_t* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = src + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* p = dst + b * 34;
    const uint16_t dh = f32_to_f16(d);
    std::memcpy(p, &dh, 2);
    for (int j = 0; j < 32; ++j) p[2 + j] = uint8_t(int8_t(std::roundf(x[j] * id)));
  }
}

}  // namespace

GgufWriter::GgufWriter() { add_u32("general.alignment", uint32_t(kGgufDefaultAlignment)); }

void GgufWriter::add_kv(std::string key, GgufType type, std::string value) {
  SF_CHECK(!has_key(key), "GGUF key ", key, " added twice");
  std::string s;
  put<uint32_t>(s, uint32_t(type));
  s += value;
  kvs_.emplace_back(std::move(key), std::move(s));
}

void GgufWriter::add_u32(std::string k, uint32_t v) {
  std::string s;
  put(s, v);
  add_kv(std::move(k), GgufType::u32, s);
}
void GgufWriter::add_i32(std::string k, int32_t v) {
  std::string s;
  put(s, v);
  add_kv(std::move(k), GgufType::i32, s);
}
void GgufWriter::add_f32(std::string k, float v) {
  std::string s;
  put(s, v);
  add_kv(std::move(k), GgufType::f32, s);
}
void GgufWriter::add_bool(std::string k, bool v) {
  add_kv(std::move(k), GgufType::boolean, std::string(1, v ? '\1' : '\0'));
}
void GgufWriter::add_string(std::string k, std::string_view v) {
  std::string s;
  put_string(s, v);
  add_kv(std::move(k), GgufType::string, s);
}
void GgufWriter::add_strings(std::string k, const std::vector<std::string>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufType::string));
  put<uint64_t>(s, v.size());
  for (auto& x : v) put_string(s, x);
  add_kv(std::move(k), GgufType::array, s);
}
void GgufWriter::add_i32s(std::string k, const std::vector<int32_t>& v) {
  add_kv(std::move(k), GgufType::array, encode_array(GgufType::i32, v));
}
void GgufWriter::add_f32s(std::string k, const std::vector<float>& v) {
  add_kv(std::move(k), GgufType::array, encode_array(GgufType::f32, v));
}

bool GgufWriter::has_key(std::string_view key) const {
  for (auto& [k, v] : kvs_)
    if (k == key) return true;
  return false;
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, uint32_t type,
                            Fill fill) {
  SF_CHECK(name.size() <= kMaxTensorName, "GGUF tensor name ", name, " is longer than ",
           kMaxTensorName, " bytes");
  for (auto& t : tensors_) SF_CHECK(t.name != name, "GGUF tensor ", name, " added twice");
  SF_CHECK(!dims.empty() && dims.size() <= 4, "GGUF tensor ", name, " has ", dims.size(), " dims");
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  auto bytes = gguf_tensor_bytes(type, dims[0], numel);
  SF_CHECK(bytes.has_value(), "GGUF tensor ", name, ": type ", gguf_tensor_type_name(type),
           " cannot hold dims ", shape_str(dims));
  tensors_.push_back({std::move(name), std::move(dims), type, *bytes, data_bytes_, std::move(fill)});
  data_bytes_ = align_up(data_bytes_ + *bytes);
}

std::string GgufWriter::header() const {
  std::string h;
  h.append("GGUF", 4);
  put<uint32_t>(h, kVersion);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kvs_.size());
  for (auto& [k, v] : kvs_) {
    put_string(h, k);
    h += v;
  }
  for (auto& t : tensors_) {
    put_string(h, t.name);
    put<uint32_t>(h, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(h, uint64_t(d));
    put<uint32_t>(h, t.type);
    put<uint64_t>(h, t.offset);
  }
  h.resize(align_up(h.size()), '\0');
  return h;
}

uint64_t GgufWriter::write(const std::filesystem::path& path) const {
  AtomicFile f(path);
  const std::string h = header();
  f.write(h);
  std::vector<uint8_t> buf;
  uint64_t at = 0;  // within the data section
  for (auto& t : tensors_) {
    buf.assign(align_up(t.bytes), 0);  // the padding after a tensor is zeros
    t.fill(buf.data());
    SF_CHECK(at == t.offset, "GGUF tensor ", t.name, " offset drifted");
    f.write(buf.data(), buf.size());
    at += buf.size();
  }
  f.commit();
  return h.size() + at;
}

void gguf_encode(const float* src, uint32_t type, uint8_t* dst, int64_t n) {
  switch (type) {
    case ggml_type::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case ggml_type::F16: convert_from_f32(src, dst, DType::f16, size_t(n)); return;
    case ggml_type::BF16: convert_from_f32(src, dst, DType::bf16, size_t(n)); return;
    case ggml_type::Q8_0:
      SF_CHECK(n % 32 == 0, "Q8_0 encode of ", n, " elements, not whole blocks of 32");
      encode_q8_0(src, dst, n / 32);
      return;
  }
  SF_CHECK(false, "gguf_encode: type ", gguf_tensor_type_name(type), " is not written here");
}

}  // namespace sf
