// GGUF reading (the llama.cpp / ggml file format, versions 2 and 3), written from the format
// description in ggml's docs/gguf.md:
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x (string key, u32 value type, value)
//   tensor_count x (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32 ggml type,
//                   u64 offset relative to the data section)
//   padding to `alignment` (general.alignment, default 32) | data section
// Strings are u64 length + bytes (no NUL); everything is little-endian.
//
// Owns: parsing + validation of header, metadata and tensor infos (GgufView, over any
// in-memory image, so a fuzzer can feed it), a read-only mmap of a file (GgufFile), and
// dequantizing one tensor to fp32: F32, F16, BF16, Q8_0 and Q4_1, bit-identical to gguf-py's
// numpy dequantize (Q8_0: q * d; Q4_1: (d * q) + m, in float32, in numpy's order; d * q of
// an f16 d and a 4- or 8-bit q is exact in float32, so only Q4_1's + m rounds, and gguf.cpp
// is compiled without FMA contraction so that this stays true of the code as written).
// Reading OVERWRITES the destination; nothing accumulates.
// Every malformed input is an sf::Error(input) naming the file, the key or tensor, and what
// is wrong. Every count and offset is checked against the bytes that remain before anything
// is allocated or read, so no input reads out of bounds or allocates more than a small
// multiple of its own size. Not protected against another process truncating a mapped file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/mapped_file.h"

namespace sf {

// Metadata value types (the numbering of the format).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
  array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "uint32", "string", ...

// One metadata value. Scalars keep their type; arrays keep their element type and either
// the raw little-endian elements (numeric and bool), the strings, or nested arrays.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_integer() const;  // u8 .. i64 (not bool)
  bool is_number() const;   // integer or f32/f64
  bool is_string() const { return type_ == GgufType::string; }
  bool is_array() const { return type_ == GgufType::array; }

  // Scalar accessors; each throws Error(input) naming `what` (the key) if the type is wrong.
  int64_t as_int(std::string_view what) const;    // any integer type that fits in int64
  double as_double(std::string_view what) const;  // any number
  bool as_bool(std::string_view what) const;
  const std::string& as_string(std::string_view what) const;

  // Arrays.
  GgufType elem_type() const { return elem_; }
  size_t size() const;  // elements (0 for scalars)
  int64_t int_at(size_t i, std::string_view what) const;
  double double_at(size_t i, std::string_view what) const;
  const std::string& string_at(size_t i, std::string_view what) const;
  const GgufValue& array_at(size_t i, std::string_view what) const;

  // A short description for messages: "uint32 30", "string \"llama\"", "array of 49152 string".
  std::string describe() const;

 private:
  friend struct GgufParser;
  GgufType type_ = GgufType::u8;
  GgufType elem_ = GgufType::u8;  // arrays
  uint64_t bits_ = 0;             // scalars: the raw little-endian bits, zero-extended
  uint64_t count_ = 0;            // arrays: elements
  std::string str_;               // string scalar
  std::vector<uint8_t> raw_;      // numeric/bool arrays: count_ x element size
  std::vector<std::string> strs_;
  std::vector<GgufValue> arrs_;
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

// ggml tensor types: the ids the format uses. Only the types read_f32 converts have names
// here; every other id of ggml's table is known by its block geometry (so files holding it
// still open and validate) and refused by read_f32 with its name.
namespace ggml_type {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30;
}
std::string gguf_tensor_type_name(uint32_t ggml_type);  // "Q4_1", or "type 99 (unknown)"
bool gguf_can_read_f32(uint32_t ggml_type);            // F32, F16, BF16, Q8_0, Q4_1
// Bytes of `numel` elements of a known type whose innermost dimension `ne0` is a whole number
// of its blocks; nullopt otherwise (an unknown type, or ne0 not a multiple of the block).
std::optional<uint64_t> gguf_tensor_bytes(uint32_t ggml_type, int64_t ne0, int64_t numel);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // as in the file: innermost (contiguous) dimension first
  uint32_t type = 0;          // ggml type id
  uint64_t offset = 0;        // relative to the data section
  int64_t numel = 0;
  uint64_t bytes = 0;
  // Row-major shape, outermost first (dims reversed): a GGUF matrix [ne0 = in, ne1 = out]
  // is the row-major [out, in] matrix of PyTorch.
  std::vector<int64_t> shape() const;
};

constexpr uint64_t kGgufDefaultAlignment = 32;

// A parsed, validated GGUF image over bytes it does not own (they must outlive it).
class GgufView {
 public:
  GgufView() = default;
  static GgufView parse(const uint8_t* data, size_t size, std::string source);

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute, a multiple of alignment

  const std::vector<GgufKV>& metadata() const { return kvs_; }  // file order
  const GgufValue* find(std::string_view key) const;
  const GgufValue& get(std::string_view key) const;  // throws Error(input) naming the file

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& get_tensor(std::string_view name) const;

  // The tensor's bytes (t must come from this view).
  const uint8_t* raw(const GgufTensorInfo& t) const { return data_ + data_offset_ + t.offset; }
  // Dequantizes to fp32 into dst[0, t.numel) (overwrites), on sf::host_pool() when large.
  // Types other than F32/F16/BF16/Q8_0/Q4_1 throw Error(input) naming tensor and type.
  void read_f32(const GgufTensorInfo& t, float* dst) const;
  std::vector<float> read_f32(std::string_view name) const;

 private:
  friend struct GgufParser;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// A GGUF file mapped read-only. Move-only; the mapping lives as long as the object.
class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return file_.path(); }
  const GgufView& view() const { return view_; }

 private:
  MappedFile file_;  // moves keep the mapping in place: view_ stays valid
  GgufView view_;
};

// Dequantizes n elements (a multiple of the type's block size) of raw GGUF data; exposed
// for tests. Throws Error(input) naming `what` for unsupported types.
void gguf_dequantize(const uint8_t* src, uint32_t ggml_type, float* dst, int64_t n,
                     std::string_view what);

}  // namespace sf
