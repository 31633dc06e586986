// Safetensors reading and writing (https://huggingface.co/docs/safetensors format):
//   [u64 little-endian N][N bytes JSON header][data section]
// The header maps tensor name -> {dtype, shape, data_offsets [begin, end) relative to the
// data section}, plus an optional "__metadata__" string->string map.
//
// Owns: parsing + full validation of headers (SafetensorsView, usable on any in-memory
// buffer, which is what the fuzzer feeds), read-only mmap of files (SafetensorsFile),
// single-file or sharded model directories (SafetensorsModel), and writing files / sharded
// directories (write_safetensors_file, write_safetensors_model).
// Reading overwrites the destination buffer; nothing accumulates. Every malformed input is
// an sf::Error(input) naming the file, the tensor or field, and what is wrong; no input makes
// the parser read out of bounds (the data is only touched through validated offsets).
// Not protected against: another process truncating a file while it is mapped (SIGBUS).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/mapped_file.h"

namespace sf {

// Every element type the format names. Only BF16/F16/F32 can be read as weights; the rest
// are recognised so that a file holding e.g. an I64 buffer still opens and validates.
// (The 4- and 6-bit types of newer files are not recognised: their byte sizes are not whole.)
enum class StDType : uint8_t {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64
};
std::string_view st_dtype_name(StDType t);  // "BF16", ...
size_t st_dtype_size(StDType t);
std::optional<StDType> st_dtype_from_name(std::string_view s);
// BF16/F16/F32 -> the matching DType; nullopt for types that cannot hold weights here.
std::optional<DType> st_weight_dtype(StDType t);
StDType st_dtype_of(DType t);  // f32->F32, bf16->BF16, f16->F16, i32->I32, u32->U32, i64->I64

// Headers larger than this are refused as corrupt (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  uint64_t bytes() const { return end - begin; }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[4096, 128]"

// A parsed, validated safetensors image over bytes it does not own (they must outlive it).
class SafetensorsView {
 public:
  SafetensorsView() = default;
  // Parses and validates a whole file image of `size` bytes; `source` names it in errors.
  static SafetensorsView parse(const uint8_t* data, size_t size, std::string source);

  const std::string& source() const { return source_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // by data offset
  const TensorInfo* find(std::string_view name) const;
  const TensorInfo& get(std::string_view name) const;  // throws Error(input) naming the file
  // "__metadata__" (an object of strings; empty object when the file has none).
  const nlohmann::json& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N
  uint64_t data_offset() const { return 8 + header_bytes_; }
  uint64_t data_bytes() const { return data_bytes_; }
  // Bytes of the data section covered by no tensor (legal here; HF's own reader refuses
  // them). Described in notes().
  uint64_t gap_bytes() const { return gap_bytes_; }
  const std::vector<std::string>& notes() const { return notes_; }

  // The tensor's bytes (t must come from this view). Possibly unaligned.
  const uint8_t* raw(const TensorInfo& t) const { return data_ + data_offset() + t.begin; }
  // Converts a BF16/F16/F32 tensor to fp32 into dst[0, t.numel) (overwrites); big tensors
  // are converted on sf::host_pool(). Other dtypes throw Error(input).
  void read_f32(const TensorInfo& t, float* dst) const;
  std::vector<float> read_f32(std::string_view name) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string source_;
  uint64_t header_bytes_ = 0, data_bytes_ = 0, gap_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::vector<std::string> notes_;
};

// A safetensors file mapped read-only. Move-only; the mapping lives as long as the object.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsView& view() const { return view_; }
  const std::vector<TensorInfo>& tensors() const { return view_.tensors(); }
  const TensorInfo* find(std::string_view name) const { return view_.find(name); }
  const TensorInfo& get(std::string_view name) const { return view_.get(name); }
  void read_f32(const TensorInfo& t, float* dst) const { view_.read_f32(t, dst); }
  std::vector<float> read_f32(std::string_view name) const { return view_.read_f32(name); }

 private:
  MappedFile file_;  // moves keep the mapping in place: view_ stays valid
  SafetensorsView view_;
};

// Parses the text of a model.safetensors.index.json: its weight_map as (tensor, shard file)
// pairs, each file a plain name inside the directory. `source` names the file in errors.
std::vector<std::pair<std::string, std::string>> parse_safetensors_index(
    std::string_view text, const std::string& source);

// The weights of a model directory: model.safetensors, or model.safetensors.index.json and
// the shards its weight_map names. When both exist the single file wins (as in
// transformers); write_safetensors_model orders its writes so that either choice is a
// complete checkpoint at every moment.
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::filesystem::path& dir);

  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const std::filesystem::path& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // file order, then data order
  size_t size() const { return entries_.size(); }
  std::optional<Entry> find(std::string_view name) const;
  Entry get(std::string_view name) const;  // throws Error(input) naming the directory
  void read_f32(std::string_view name, float* dst) const;
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, std::pair<size_t, const TensorInfo*>> entries_;
  std::vector<std::string> notes_;
};

// One tensor to write: exactly one of f32 (converted to `dtype` in chunks while writing;
// dtype must be bf16, f16 or f32) or raw (bytes already in `dtype`) is set, unless the
// tensor is empty.
struct TensorWrite {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  const float* f32 = nullptr;
  const void* raw = nullptr;
};

// Writes one safetensors file atomically (AtomicFile). Header: compact JSON, tensors in the
// given order, "__metadata__" = {"format": "pt"} plus `metadata`, padded with spaces so the
// data section starts at a multiple of 8. Tensors are packed back to back (the format forbids
// holes), so each one is 8-byte aligned whenever the earlier byte sizes are multiples of 8.
// Returns the file size.
uint64_t write_safetensors_file(const std::filesystem::path& file,
                                const std::vector<TensorWrite>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

constexpr uint64_t kDefaultMaxShardBytes = 5ull << 30;  // transformers' default "5GB"

// Writes `tensors` into directory `dir` (created if missing) as HF does: one
// model.safetensors when the data fits in max_shard_bytes, else shards
// model-0000i-of-0000n.safetensors of at most max_shard_bytes of tensor data each (a single
// larger tensor gets a shard of its own) plus model.safetensors.index.json
// ({"metadata": {"total_size"}, "weight_map"}). Afterwards removes the files of an earlier
// save in the other form (model.safetensors / the index / model-*-of-*.safetensors not
// written now). Each file is atomic; for an all-or-nothing checkpoint write into a fresh
// directory and rename it. Returns the files written.
std::vector<std::filesystem::path> write_safetensors_model(
    const std::filesystem::path& dir, const std::vector<TensorWrite>& tensors,
    uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace sf
