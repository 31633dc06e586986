// The resume files (see resume_state.h): the store's bytes per unit written raw, read back
// after validation, converted through fp32 when the formats differ.
#include "train/resume_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "optim/state_adamw.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kResumeDir = "resume";
enum class Part { master, m, v };
constexpr Part kParts[3] = {Part::master, Part::m, Part::v};

const char* file_of(Part p) {
  return p == Part::master ? "master.safetensors"
         : p == Part::m    ? "adam_m.safetensors"
                           : "adam_v.safetensors";
}

const char* content_of(Part p, StateFormat f) {
  if (p == Part::master)
    return f.master == MasterFormat::bf16 ? "bf16 master weights" : "fp32 master weights";
  return p == Part::m ? "AdamW first moment" : "AdamW second moment";
}

// How one unit's part is stored: its dtype and its bytes (what the layout gives it).
struct TensorSpec {
  DType dtype;
  size_t bytes;
};

TensorSpec spec_of(Part p, const UnitStateLayout& l) {
  if (p == Part::master)
    return {l.format.master == MasterFormat::bf16 ? DType::bf16 : DType::f32, l.master_bytes};
  switch (l.format.moments) {
    case MomentFormat::f32: return {DType::f32, l.moment_bytes};
    case MomentFormat::bf16: return {DType::bf16, l.moment_bytes};
    case MomentFormat::int8: break;
  }
  return {DType::u8, l.moment_bytes};
}

void* data_of(Part p, const UnitStateView& s) {
  return p == Part::master ? s.master : p == Part::m ? s.m : s.v;
}
float* scale_of(Part p, const UnitStateView& s) { return p == Part::m ? s.m_scale : s.v_scale; }

std::map<std::string, std::string> format_metadata(StateFormat f) {
  return {{"master_weights", master_format_name(f.master)},
          {"optimizer_state", moment_format_name(f.moments)},
          {"state_block", std::to_string(kStateBlock)},
          {"int8_min_numel", std::to_string(kInt8MinNumel)}};
}

// memcpy on the host pool: the state of an 8B model is tens of GB.
void copy_bytes(void* dst, const void* src, size_t n) {
  if (n == 0) return;
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  host_pool().parallel_for(int64_t(n), [&](int64_t b, int64_t e) {
    std::memcpy(d + b, s + b, size_t(e - b));
  }, int64_t(1) << 22);
}

// A metadata value of a resume file, or `fallback` when the file has none.
std::string meta(const SafetensorsFile& f, const char* key, const char* fallback) {
  const auto& m = f.view().metadata();
  return m.contains(key) && m.at(key).is_string() ? m.at(key).get<std::string>() : fallback;
}

StateFormat file_format(const SafetensorsFile& master, const SafetensorsFile& m) {
  const std::string w = meta(master, "master_weights", "fp32");
  const std::string s = meta(m, "optimizer_state", "fp32");
  const auto mf = parse_master_format(w);
  const auto sf = parse_moment_format(s);
  SF_REQUIRE(mf, master.path().string(), ": master_weights \"", w,
             "\" is not a format this build knows (fp32, bf16); resume with the slideformer "
             "version that wrote it");
  SF_REQUIRE(sf, m.path().string(), ": optimizer_state \"", s,
             "\" is not a format this build knows (fp32, bf16, int8); resume with the "
             "slideformer version that wrote it");
  for (const char* key : {"state_block", "int8_min_numel"}) {
    const std::string want = format_metadata({}).at(key);
    const std::string got = meta(m, key, want.c_str());
    SF_REQUIRE(got == want, m.path().string(), ": ", key, " ", got, " but this build uses ",
               want, "; resume with the slideformer version that wrote the checkpoint");
  }
  return {*sf, *mf};
}

// The tensor `name` of f, checked to be `dtype` of `bytes` bytes.
const TensorInfo& expect_tensor(const SafetensorsFile& f, const std::string& name, DType dtype,
                                size_t bytes) {
  const TensorInfo* t = f.find(name);
  SF_REQUIRE(t, f.path().string(), ": tensor \"", name,
             "\" is missing; the checkpoint belongs to another model shape");
  const size_t es = dtype_size(dtype);
  SF_REQUIRE(t->dtype == st_dtype_of(dtype) && t->bytes() == bytes, f.path().string(),
             ": tensor \"", name, "\" is ", st_dtype_name(t->dtype), " ", shape_str(t->shape),
             " but this model needs ", st_dtype_name(st_dtype_of(dtype)), " [", bytes / es,
             "]; the checkpoint belongs to another model shape");
  return *t;
}

// Unit u's part from f into the state `s` (laid out in the file's format).
void read_unit_part(const SafetensorsFile& f, Part p, const std::string& name,
                    const UnitStateView& s) {
  const TensorSpec spec = spec_of(p, *s.layout);
  copy_bytes(data_of(p, s), f.view().raw(expect_tensor(f, name, spec.dtype, spec.bytes)),
             spec.bytes);
  if (p == Part::master || s.format.moments != MomentFormat::int8) return;
  const size_t scale_bytes = size_t(s.layout->scale_count) * sizeof(float);
  copy_bytes(scale_of(p, s), f.view().raw(expect_tensor(f, name + ".scale", DType::f32, scale_bytes)),
             scale_bytes);
}

struct ResumeFiles {
  std::vector<SafetensorsFile> files;  // master, m, v
  StateFormat format;
};

ResumeFiles open_resume_files(const fs::path& dir, size_t n_units) {
  ResumeFiles r;
  for (Part p : kParts) {
    const fs::path path = dir / kResumeDir / file_of(p);
    SF_REQUIRE(fs::exists(path), path.string(), ": not found; the checkpoint has no resume state");
    r.files.emplace_back(path);
  }
  r.format = file_format(r.files[0], r.files[1]);
  const size_t per_unit = r.format.moments == MomentFormat::int8 ? 2 : 1;
  for (size_t i = 0; i < 3; ++i) {
    const size_t want = n_units * (i == 0 ? 1 : per_unit);
    SF_REQUIRE(r.files[i].tensors().size() == want, r.files[i].path().string(), ": holds ",
               r.files[i].tensors().size(), " tensors but this model's state has ", want,
               " (", n_units, " units); the checkpoint belongs to another model shape");
  }
  return r;
}

// Unit u of the files (in their format) converted into the store's format, through fp32
// windows of 16M elements (192 MiB of scratch; a copy of the unit's state as the file holds
// it is the larger cost, up to 12 bytes per element of the largest unit).
void convert_unit(const ResumeFiles& r, const ModelLayout& layout, ParamStore& store, int u) {
  constexpr int64_t kChunk = int64_t(1) << 24;
  const StateUnit unit{store.numel(u), store.ranges(u)};
  ParamStore saved({unit}, r.format);  // one unit in the checkpoint's format
  for (Part p : kParts)
    read_unit_part(r.files[size_t(p)], p, resume_unit_name(layout, u), saved.state(0));
  const size_t n = size_t(std::min(kChunk, unit.numel));
  std::vector<float> w(n), m(n), v(n);
  for_each_state_window(unit, kChunk, [&](int64_t off, int64_t len) {
    state_to_f32(saved.state(0), off, len, w.data(), m.data(), v.data(), unit.ranges);
    state_from_f32(store.state(u), off, len, w.data(), m.data(), v.data(), unit.ranges);
  });
}

}  // namespace

void for_each_state_window(const StateUnit& unit, int64_t chunk,
                           const std::function<void(int64_t off, int64_t len)>& fn) {
  SF_CHECK(chunk >= 2 * kStateBlock, "for_each_state_window: chunk ", chunk, " is below two blocks");
  for (const ParamRange& r : unit.ranges) {
    const int64_t end = r.offset + r.numel;
    const int64_t step = r.row > 0 ? r.row * std::max<int64_t>(1, chunk / r.row) : chunk;
    for (int64_t a = r.offset; a < end;) {
      int64_t b = std::min(end, a + step);
      if (r.row == 0 && b < end) b = b / kStateBlock * kStateBlock;  // > a: step >= 2 blocks
      fn(a, b - a);
      a = b;
    }
  }
}

std::string resume_unit_name(const ModelLayout& layout, int u) {
  const Unit& unit = layout.units[size_t(u)];
  switch (unit.kind) {
    case UnitKind::embedding: return "embedding";
    case UnitKind::layer: return "layers." + std::to_string(unit.layer);
    case UnitKind::head: return "head";
  }
  return "unit." + std::to_string(u);
}

void write_resume_tensors(const fs::path& dir, const ModelLayout& layout, const ParamStore& st,
                          int64_t step) {
  const StateFormat f = st.format();
  for (Part p : kParts) {
    std::vector<TensorWrite> ts;
    for (int u = 0; u < st.n_units(); ++u) {
      const UnitStateView s = st.state(u);
      const TensorSpec spec = spec_of(p, *s.layout);
      const std::string name = resume_unit_name(layout, u);
      ts.push_back({name, spec.dtype, {int64_t(spec.bytes / dtype_size(spec.dtype))}, nullptr,
                    data_of(p, s)});
      if (p != Part::master && f.moments == MomentFormat::int8)
        ts.push_back({name + ".scale", DType::f32, {s.layout->scale_count}, nullptr, scale_of(p, s)});
    }
    std::map<std::string, std::string> meta = format_metadata(f);
    meta["slideformer"] = "resume-state";
    meta["content"] = content_of(p, f);
    meta["step"] = std::to_string(step);
    write_safetensors_file(dir / file_of(p), ts, meta);
  }
}

StateFormat resume_state_format(const fs::path& dir) {
  std::vector<SafetensorsFile> f;
  for (Part p : {Part::master, Part::m}) {
    const fs::path path = dir / kResumeDir / file_of(p);
    SF_REQUIRE(fs::exists(path), path.string(), ": not found; the checkpoint has no resume state");
    f.emplace_back(path);
  }
  return file_format(f[0], f[1]);
}

StateFormat load_resume_tensors(const fs::path& dir, const ModelLayout& layout, ParamStore& store) {
  SF_CHECK(int(layout.units.size()) == store.n_units(), "layout and store disagree");
  const ResumeFiles r = open_resume_files(dir, layout.units.size());
  for (int u = 0; u < store.n_units(); ++u) {
    if (r.format != store.format()) {
      convert_unit(r, layout, store, u);
    } else {
      for (Part p : kParts)
        read_unit_part(r.files[size_t(p)], p, resume_unit_name(layout, u), store.state(u));
    }
    store.settle_mapping(u);  // state on disk: written through, not held as this process's RSS
  }
  return r.format;
}

}  // namespace sf
