#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/atomic_file.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct StDTypeRow {
  StDType t;
  const char* name;
  size_t size;
};
constexpr StDTypeRow kStDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},     {StDType::I8, "I8", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1}, {StDType::F8_E4M3, "F8_E4M3", 1},
    {StDType::F8_E8M0, "F8_E8M0", 1}, {StDType::C64, "C64", 8},
    {StDType::I16, "I16", 2},   {StDType::U16, "U16", 2},   {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I32, "I32", 4},   {StDType::U32, "U32", 4},
    {StDType::F32, "F32", 4},   {StDType::F64, "F64", 8},   {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8},
};

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// A name as it appears in a message: quoted, and cut short if a corrupt header made it huge.
std::string q(std::string_view s) {
  constexpr size_t kMax = 120;
  if (s.size() <= kMax) return cat('"', s, '"');
  return cat('"', s.substr(0, kMax), "...\" (", s.size(), " bytes)");
}

// A JSON value's kind, for messages (never dump() a value of unknown size or depth).
std::string kind_of(const json& v) {
  if (v.is_number_unsigned() || v.is_number_integer()) return cat("the integer ", v.dump());
  if (v.is_number_float()) return cat("the number ", v.dump());
  if (v.is_string()) return cat("the string ", q(v.get_ref<const std::string&>()));
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  if (v.is_array()) return cat("an array of ", v.size());
  return cat("an object of ", v.size(), " keys");
}

constexpr int kMaxJsonDepth = 16;  // a valid header nests 3 deep

// Parses JSON text, refusing duplicate keys (the last would silently win) and deep nesting.
json parse_json_strict(std::string_view text, const std::string& what) {
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          SF_FAIL(input, what, " nests deeper than ", kMaxJsonDepth,
                  " levels; the file is corrupt");
        if (ev == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!keys.back().insert(k).second)
            SF_FAIL(input, what, ": key ", q(k), " appears twice",
                    depth == 1 ? " (a tensor name must be unique)" : "");
        }
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    SF_FAIL(input, what, " is not valid JSON (", e.what(), ")");
  }
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(p[i]) << (8 * i);
  return n;
}

void put_u64_le(uint8_t* p, uint64_t n) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(n >> (8 * i));
}

// Parses one header entry into t (name already set). `where` prefixes every message.
void parse_entry(const json& v, const std::string& where, TensorInfo& t) {
  SF_REQUIRE(v.is_object(), where, " must be an object {\"dtype\", \"shape\", \"data_offsets\"}, got ",
             kind_of(v));
  auto field = [&](const char* f) -> const json& {
    auto it = v.find(f);
    SF_REQUIRE(it != v.end(), where, " has no \"", f, "\" field");
    return *it;
  };
  const json& dt = field("dtype");
  SF_REQUIRE(dt.is_string(), where, ": \"dtype\" must be a string such as \"BF16\", got ",
             kind_of(dt));
  auto parsed = st_dtype_from_name(dt.get_ref<const std::string&>());
  SF_REQUIRE(parsed, where, ": unknown dtype ", q(dt.get_ref<const std::string&>()),
             "; known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, "
             "F32, C64, F64, I64, U64");
  t.dtype = *parsed;

  const json& sh = field("shape");
  SF_REQUIRE(sh.is_array(), where, ": \"shape\" must be an array of integers, got ", kind_of(sh));
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < sh.size(); ++i) {
    const json& d = sh[i];
    SF_REQUIRE(d.is_number_integer(), where, ": \"shape\"[", i, "] must be an integer, got ",
               kind_of(d));
    SF_REQUIRE(d.is_number_unsigned(), where, ": \"shape\"[", i, "] is negative (",
               d.get<int64_t>(), ")");
    uint64_t n = d.get<uint64_t>();
    SF_REQUIRE(n <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": \"shape\"[", i,
               "] = ", n, " is too large");
    t.shape.push_back(int64_t(n));
    overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
  }
  uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, uint64_t(st_dtype_size(t.dtype)), &bytes) ||
             numel > uint64_t(std::numeric_limits<int64_t>::max());
  SF_REQUIRE(!overflow, where, ": shape ", shape_str(t.shape),
             " has more elements than fit in 64 bits");
  t.numel = int64_t(numel);

  const json& off = field("data_offsets");
  SF_REQUIRE(off.is_array() && off.size() == 2, where,
             ": \"data_offsets\" must be an array [begin, end], got ", kind_of(off));
  for (int i = 0; i < 2; ++i)
    SF_REQUIRE(off[i].is_number_unsigned(), where, ": \"data_offsets\"[", i,
               "] must be a non-negative integer, got ", kind_of(off[i]));
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  SF_REQUIRE(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end,
             "] has begin > end");
  SF_REQUIRE(t.end - t.begin == bytes, where, ": data_offsets [", t.begin, ", ", t.end,
             "] span ", t.end - t.begin, " bytes but shape ", shape_str(t.shape), " of ",
             st_dtype_name(t.dtype), " needs ", bytes, " bytes (", numel, " x ",
             st_dtype_size(t.dtype), ")");
}

}  // namespace

// ---- dtypes -----------------------------------------------------------------------------

std::string_view st_dtype_name(StDType t) {
  for (auto& r : kStDTypes)
    if (r.t == t) return r.name;
  return "?";
}

size_t st_dtype_size(StDType t) {
  for (auto& r : kStDTypes)
    if (r.t == t) return r.size;
  return 0;
}

std::optional<StDType> st_dtype_from_name(std::string_view s) {
  for (auto& r : kStDTypes)
    if (s == r.name) return r.t;
  return std::nullopt;
}

std::optional<DType> st_weight_dtype(StDType t) {
  switch (t) {
    case StDType::BF16: return DType::bf16;
    case StDType::F16: return DType::f16;
    case StDType::F32: return DType::f32;
    default: return std::nullopt;
  }
}

StDType st_dtype_of(DType t) {
  switch (t) {
    case DType::f32: return StDType::F32;
    case DType::bf16: return StDType::BF16;
    case DType::f16: return StDType::F16;
    case DType::i32: return StDType::I32;
    case DType::u32: return StDType::U32;
    case DType::i64: return StDType::I64;
    case DType::u8: return StDType::U8;
  }
  SF_FAIL(internal, "st_dtype_of: unknown DType ", int(t));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- SafetensorsView --------------------------------------------------------------------

SafetensorsView SafetensorsView::parse(const uint8_t* data, size_t size, std::string source) {
  SafetensorsView v;
  v.data_ = data;
  v.size_ = size;
  v.source_ = std::move(source);
  const std::string& src = v.source_;
  SF_REQUIRE(size >= 8, src, ": file is ", size,
             " bytes, shorter than the 8-byte header length that starts a safetensors file "
             "(truncated or not safetensors)");
  const uint64_t n = read_u64_le(data);
  SF_REQUIRE(n <= kMaxSafetensorsHeaderBytes, src, ": header length ", n,
             " bytes is absurdly large (limit ", kMaxSafetensorsHeaderBytes,
             "); the file is corrupt or not safetensors");
  SF_REQUIRE(n <= size - 8, src, ": header length ", n, " bytes runs past the end of the file (",
             size, " bytes in all); the file is truncated or corrupt");
  v.header_bytes_ = n;
  v.data_bytes_ = size - 8 - n;

  std::string_view text(reinterpret_cast<const char*>(data + 8), size_t(n));
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows;
  // JSON never holds a raw NUL, and the format pads headers with spaces only.
  if (size_t z = text.find('\0'); z != std::string_view::npos)
    SF_FAIL(input, src, ": header is not valid JSON (a NUL byte at header offset ", z,
            "; headers may only be padded with spaces)");
  json h = parse_json_strict(text, src + ": header");
  SF_REQUIRE(h.is_object(), src, ": header must be a JSON object, got ", kind_of(h));

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      const json& m = it.value();
      SF_REQUIRE(m.is_object(), src, ": \"__metadata__\" must be an object of strings, got ",
                 kind_of(m));
      for (auto mi = m.begin(); mi != m.end(); ++mi)
        SF_REQUIRE(mi.value().is_string(), src, ": \"__metadata__\" value ", q(mi.key()),
                   " must be a string, got ", kind_of(mi.value()));
      v.metadata_ = m;
      continue;
    }
    TensorInfo t;
    t.name = name;
    std::string where = cat(src, ": tensor ", q(name));
    parse_entry(it.value(), where, t);
    SF_REQUIRE(t.end <= v.data_bytes_, where, ": data_offsets [", t.begin, ", ", t.end,
               "] end beyond the data section (", v.data_bytes_,
               " bytes); the file is truncated or the header is corrupt");
    v.tensors_.push_back(std::move(t));
  }

  // Data order; then no two tensors may share a byte.
  std::sort(v.tensors_.begin(), v.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered_end = 0, covered = 0;
  const TensorInfo* last = nullptr;  // the tensor reaching covered_end
  for (const auto& t : v.tensors_) {
    if (t.bytes() == 0) continue;
    SF_REQUIRE(!last || t.begin >= covered_end, src, ": tensors ", q(last->name), " (bytes [",
               last->begin, ", ", last->end, ")) and ", q(t.name), " (bytes [", t.begin, ", ",
               t.end, ")) overlap; the header is corrupt");
    covered += t.bytes();
    covered_end = t.end;
    last = &t;
  }
  v.gap_bytes_ = v.data_bytes_ - covered;
  if (v.gap_bytes_ > 0)
    v.notes_.push_back(cat(src, ": ", v.gap_bytes_, " of the ", v.data_bytes_,
                           " data bytes belong to no tensor (holes or trailing bytes); "
                           "readable here, but Hugging Face's reader refuses such files"));
  for (size_t i = 0; i < v.tensors_.size(); ++i) v.index_.emplace(v.tensors_[i].name, i);
  return v;
}

const TensorInfo* SafetensorsView::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsView::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  SF_REQUIRE(t, source_, ": no tensor named ", q(name));
  return *t;
}

void SafetensorsView::read_f32(const TensorInfo& t, float* dst) const {
  auto wd = st_weight_dtype(t.dtype);
  SF_REQUIRE(wd, source_, ": tensor ", q(t.name), " has dtype ", st_dtype_name(t.dtype),
             "; only BF16, F16 and F32 tensors can be read as weights");
  SF_CHECK(t.end <= data_bytes_ && t.begin <= t.end, "tensor not from this view");
  const uint8_t* src = raw(t);
  const size_t es = st_dtype_size(t.dtype);
  const DType d = *wd;
  auto convert = [&](int64_t b, int64_t e) {
    const uint8_t* p = src + size_t(b) * es;
    if (reinterpret_cast<uintptr_t>(p) % es == 0) {
      convert_to_f32(p, d, dst + b, size_t(e - b));
      return;
    }
    // An unaligned tensor (legal in the format): bounce through an aligned buffer, since
    // reading uint16/float through a misaligned pointer is undefined behaviour.
    alignas(8) uint8_t buf[16384];
    const int64_t step = int64_t(sizeof(buf) / es);
    for (int64_t i = b; i < e; i += step) {
      int64_t k = std::min(step, e - i);
      std::memcpy(buf, src + size_t(i) * es, size_t(k) * es);
      convert_to_f32(buf, d, dst + i, size_t(k));
    }
  };
  constexpr int64_t kParallelMin = 1 << 18;  // below this, threads cost more than they save
  if (t.numel >= kParallelMin)
    host_pool().parallel_for(t.numel, convert, 8192);
  else if (t.numel > 0)
    convert(0, t.numel);
}

std::vector<float> SafetensorsView::read_f32(std::string_view name) const {
  const TensorInfo& t = get(name);
  std::vector<float> out(size_t(t.numel));
  read_f32(t, out.data());
  return out;
}

// ---- SafetensorsFile --------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const fs::path& path)
    : file_(path), view_(SafetensorsView::parse(file_.data(), file_.size(), path.string())) {}

// ---- SafetensorsModel -------------------------------------------------------------------

std::vector<std::pair<std::string, std::string>> parse_safetensors_index(
    std::string_view text, const std::string& isrc) {
  if (size_t z = text.find('\0'); z != std::string_view::npos)
    SF_FAIL(input, isrc, " is not valid JSON (a NUL byte at offset ", z, ")");
  json j = parse_json_strict(text, isrc);
  SF_REQUIRE(j.is_object(), isrc, ": must be a JSON object, got ", kind_of(j));
  auto wm_it = j.find("weight_map");
  SF_REQUIRE(wm_it != j.end(), isrc, ": has no \"weight_map\" object");
  const json& wm = *wm_it;
  SF_REQUIRE(wm.is_object(), isrc, ": \"weight_map\" must be an object name -> file, got ",
             kind_of(wm));
  SF_REQUIRE(!wm.empty(), isrc, ": \"weight_map\" is empty");
  std::vector<std::pair<std::string, std::string>> mapped;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    SF_REQUIRE(it.value().is_string(), isrc, ": weight_map[", q(it.key()),
               "] must be a file name string, got ", kind_of(it.value()));
    const std::string& f = it.value().get_ref<const std::string&>();
    SF_REQUIRE(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
                   f.find('\\') == std::string::npos && f.find('\0') == std::string::npos,
               isrc, ": weight_map[", q(it.key()), "] = ", q(f),
               " is not a plain file name inside the model directory");
    mapped.emplace_back(it.key(), f);
  }
  return mapped;
}

SafetensorsModel::SafetensorsModel(const fs::path& dir) : dir_(dir) {
  const std::string d = dir.string();
  std::error_code ec;
  SF_REQUIRE(fs::is_directory(dir, ec), d, ": not a directory (expected a model directory with "
                                           "config.json and *.safetensors)");
  const fs::path single = dir / kSingleFile, index = dir / kIndexFile;
  if (fs::exists(single, ec)) {
    files_.emplace_back(single);
    for (auto& t : files_[0].tensors()) entries_.emplace(t.name, std::make_pair(size_t(0), &t));
    for (auto& n : files_[0].view().notes()) notes_.push_back(n);
    return;
  }
  if (!fs::exists(index, ec)) {
    bool has_bin = fs::exists(dir / "pytorch_model.bin", ec) ||
                   fs::exists(dir / "pytorch_model.bin.index.json", ec);
    SF_FAIL(input, d, ": no ", kSingleFile, " or ", kIndexFile,
            has_bin ? "; the directory holds PyTorch .bin weights, which slideformer does not "
                      "read: convert them to safetensors first"
                    : "; point at a Hugging Face model directory");
  }
  sharded_ = true;
  const std::string isrc = index.string();
  std::map<std::string, size_t> shard_of_file;  // file name -> index into files_
  auto mapped = parse_safetensors_index(read_file(index), isrc);  // tensor, file
  for (auto& [name, f] : mapped) shard_of_file.emplace(f, 0);
  for (auto& [f, idx] : shard_of_file) {
    fs::path p = dir / f;
    SF_REQUIRE(fs::exists(p, ec), isrc, ": shard ", q(f), " (named in weight_map) does not exist in ",
               d, "; the download is incomplete");
    idx = files_.size();
    files_.emplace_back(p);
  }
  // Every tensor of every shard, each in one shard only.
  for (size_t fi = 0; fi < files_.size(); ++fi)
    for (auto& t : files_[fi].tensors()) {
      auto [it, fresh] = entries_.emplace(t.name, std::make_pair(fi, &t));
      SF_REQUIRE(fresh, d, ": tensor ", q(t.name), " is in two shards, ",
                 files_[it->second.first].path().filename().string(), " and ",
                 files_[fi].path().filename().string(), "; the checkpoint is inconsistent");
    }
  std::set<std::string> listed;
  for (auto& [name, f] : mapped) {
    listed.insert(name);
    size_t fi = shard_of_file.at(f);
    SF_REQUIRE(files_[fi].find(name), isrc, ": weight_map puts tensor ", q(name), " in ", q(f),
               ", but that shard has no such tensor",
               entries_.count(name)
                   ? cat(" (it is in ",
                         files_[entries_.at(name).first].path().filename().string(), ")")
                   : std::string());
  }
  for (auto& [name, e] : entries_)
    if (!listed.count(name))
      notes_.push_back(cat(d, ": tensor ", q(name), " in ",
                           files_[e.first].path().filename().string(),
                           " is not listed in the index's weight_map"));
  for (auto& f : files_)
    for (auto& n : f.view().notes()) notes_.push_back(n);
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (auto& f : files_)
    for (auto& t : f.tensors()) out.push_back(t.name);
  return out;
}

std::optional<SafetensorsModel::Entry> SafetensorsModel::find(std::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) return std::nullopt;
  return Entry{&files_[it->second.first], it->second.second};
}

SafetensorsModel::Entry SafetensorsModel::get(std::string_view name) const {
  auto e = find(name);
  SF_REQUIRE(e, dir_.string(), ": no tensor named ", q(name), " in the model's safetensors");
  return *e;
}

void SafetensorsModel::read_f32(std::string_view name, float* dst) const {
  Entry e = get(name);
  e.file->read_f32(*e.info, dst);
}

// ---- writing ----------------------------------------------------------------------------

namespace {

struct Planned {
  const TensorWrite* t;
  uint64_t numel;
  uint64_t bytes;
};

Planned plan_tensor(const TensorWrite& t, const std::string& where) {
  SF_REQUIRE(!t.name.empty() && t.name != "__metadata__", where,
             ": tensor name must be non-empty and not \"__metadata__\"");
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    SF_REQUIRE(d >= 0, where, ": tensor ", q(t.name), " has a negative dimension in shape ",
               shape_str(t.shape));
    SF_REQUIRE(!__builtin_mul_overflow(numel, uint64_t(d), &numel), where, ": tensor ",
               q(t.name), " shape ", shape_str(t.shape), " overflows");
  }
  uint64_t bytes = 0;
  SF_REQUIRE(!__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &bytes), where,
             ": tensor ", q(t.name), " is too large");
  if (numel > 0) {
    SF_REQUIRE((t.f32 != nullptr) != (t.raw != nullptr), where, ": tensor ", q(t.name),
               " needs exactly one source, f32 or raw");
    SF_REQUIRE(!t.f32 || t.dtype == DType::f32 || t.dtype == DType::bf16 ||
                   t.dtype == DType::f16,
               where, ": tensor ", q(t.name), ": an fp32 source can be stored as f32, bf16 or "
               "f16, not ", dtype_name(t.dtype));
  }
  return {&t, numel, bytes};
}

// Streams one tensor's payload: raw bytes as they are, fp32 converted chunk by chunk (on the
// host pool) so that the converted copy never exists in full.
void write_payload(AtomicFile& f, const Planned& p, std::vector<uint8_t>& buf) {
  const TensorWrite& t = *p.t;
  if (p.numel == 0) return;
  if (t.raw) {
    f.write(t.raw, size_t(p.bytes));
    return;
  }
  if (t.dtype == DType::f32) {
    f.write(t.f32, size_t(p.bytes));
    return;
  }
  constexpr uint64_t kChunk = 1u << 22;  // elements: 8 MiB of bf16 per write
  const size_t es = dtype_size(t.dtype);
  buf.resize(size_t(std::min(kChunk, p.numel)) * es);
  for (uint64_t i = 0; i < p.numel; i += kChunk) {
    const uint64_t k = std::min(kChunk, p.numel - i);
    const float* src = t.f32 + i;
    uint8_t* dst = buf.data();
    if (k >= (1u << 18))
      host_pool().parallel_for(int64_t(k), [&](int64_t b, int64_t e) {
        convert_from_f32(src + b, dst + size_t(b) * es, t.dtype, size_t(e - b));
      }, 4096);
    else
      convert_from_f32(src, dst, t.dtype, size_t(k));
    f.write(dst, size_t(k) * es);
  }
}

uint64_t write_planned(const fs::path& file, const std::vector<Planned>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (auto& [k, val] : metadata) meta[k] = val;
  h["__metadata__"] = meta;
  uint64_t off = 0;
  for (auto& p : tensors) {
    SF_REQUIRE(!h.contains(p.t->name), file.string(), ": tensor ", q(p.t->name),
               " is given twice");
    h[p.t->name] = {{"dtype", std::string(st_dtype_name(st_dtype_of(p.t->dtype)))},
                    {"shape", p.t->shape},
                    {"data_offsets", {off, off + p.bytes}}};
    off += p.bytes;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& e) {  // a name that is not UTF-8
    SF_FAIL(input, file.string(), ": cannot write the header (", e.what(),
            "); tensor names and metadata must be UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  uint8_t len[8];
  put_u64_le(len, text.size());
  AtomicFile f(file);
  f.write(len, 8);
  f.write(text);
  std::vector<uint8_t> buf;
  for (auto& p : tensors) write_payload(f, p, buf);
  f.commit();
  return 8 + text.size() + off;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void remove_if_exists(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  if (ec)
    SF_FAIL(io, p.string(), ": cannot remove stale file from an earlier save (", ec.message(),
            ")");
}

}  // namespace

uint64_t write_safetensors_file(const fs::path& file, const std::vector<TensorWrite>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  std::vector<Planned> plan;
  for (auto& t : tensors) plan.push_back(plan_tensor(t, file.string()));
  return write_planned(file, plan, metadata);
}

std::vector<fs::path> write_safetensors_model(const fs::path& dir,
                                              const std::vector<TensorWrite>& tensors,
                                              uint64_t max_shard_bytes) {
  const std::string d = dir.string();
  SF_REQUIRE(max_shard_bytes > 0, d, ": max_shard_bytes must be positive");
  SF_REQUIRE(!tensors.empty(), d, ": no tensors to write");
  std::error_code ec;
  fs::create_directories(dir, ec);
  SF_REQUIRE(fs::is_directory(dir), d, ": cannot create the output directory (", ec.message(),
             ")");

  // Greedy packing in the given order, as transformers does.
  std::vector<std::vector<Planned>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  std::set<std::string> seen;
  for (auto& t : tensors) {
    Planned p = plan_tensor(t, d);
    SF_REQUIRE(seen.insert(t.name).second, d, ": tensor ", q(t.name), " is given twice");
    if (!shards.back().empty() && shard_bytes + p.bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(p);
    shard_bytes += p.bytes;
    total += p.bytes;
  }

  std::vector<fs::path> written;
  const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  auto stale_shards = [&](const std::set<std::string>& keep) {
    std::vector<fs::path> out;
    std::error_code ec2;
    for (auto& e : fs::directory_iterator(dir, ec2)) {
      std::string n = e.path().filename().string();
      if (std::regex_match(n, shard_re) && !keep.count(n)) out.push_back(e.path());
    }
    return out;
  };
  if (shards.size() == 1) {
    // The single file wins over an index on load, so it is complete from this moment on.
    written.push_back(dir / kSingleFile);
    write_planned(written.back(), shards[0], {});
    remove_if_exists(dir / kIndexFile);
    for (auto& p : stale_shards({})) remove_if_exists(p);
  } else {
    nlohmann::ordered_json wm = nlohmann::ordered_json::object();
    std::set<std::string> names;
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string n = shard_name(i, shards.size());
      names.insert(n);
      written.push_back(dir / n);
      write_planned(written.back(), shards[i], {});
      for (auto& p : shards[i]) wm[p.t->name] = n;
    }
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = wm;
    written.push_back(dir / kIndexFile);
    write_file_atomic(written.back(), idx.dump(2) + "\n");
    // An old single file would shadow the index: it goes after the index is complete.
    remove_if_exists(dir / kSingleFile);
    for (auto& p : stale_shards(names)) remove_if_exists(p);
  }
  fsync_dir(dir);
  return written;
}

}  // namespace sf
