#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/model_card.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kResumeDir = "resume";
const char* const kResumeFiles[3] = {"master.safetensors", "adam_m.safetensors",
                                     "adam_v.safetensors"};

std::string unit_name(const ModelLayout& layout, int u) {
  const Unit& unit = layout.units[size_t(u)];
  switch (unit.kind) {
    case UnitKind::embedding: return "embedding";
    case UnitKind::layer: return "layers." + std::to_string(unit.layer);
    case UnitKind::head: return "head";
  }
  return "unit." + std::to_string(u);
}

// The step of a directory named exactly "checkpoint-<digits>", else nullopt.
std::optional<int64_t> parse_checkpoint_name(const std::string& name) {
  const size_t n = std::strlen(kPrefix);
  if (name.size() <= n || name.compare(0, n, kPrefix) != 0) return std::nullopt;
  int64_t step = 0;
  const char* b = name.data() + n;
  const char* e = name.data() + name.size();
  auto [p, ec] = std::from_chars(b, e, step);
  if (ec != std::errc() || p != e || step < 0) return std::nullopt;
  return step;
}

bool state_parses(const fs::path& dir) {
  try {
    nlohmann::json s = read_trainer_state(dir);
    return s.contains("step");
  } catch (const std::exception&) {
    return false;
  }
}

void write_resume_tensors(const fs::path& dir, const ModelLayout& layout, const ParamStore& st,
                          int64_t step) {
  for (int which = 0; which < 3; ++which) {
    std::vector<TensorWrite> ts;
    for (int u = 0; u < st.n_units(); ++u) {
      TensorWrite t;
      t.name = unit_name(layout, u);
      t.dtype = DType::f32;
      t.shape = {st.numel(u)};
      t.f32 = which == 0 ? st.master(u) : which == 1 ? st.m(u) : st.v(u);
      ts.push_back(std::move(t));
    }
    write_safetensors_file(dir / kResumeFiles[which], ts,
                           {{"slideformer", "resume-state"},
                            {"content", which == 0 ? "fp32 master weights"
                                        : which == 1 ? "AdamW first moment"
                                                     : "AdamW second moment"},
                            {"step", std::to_string(step)}});
  }
}

}  // namespace

fs::path checkpoint_path(const fs::path& out, int64_t step) {
  return out / (kPrefix + std::to_string(step));
}

fs::path save_checkpoint(const fs::path& out, int64_t step, const CheckpointContents& c,
                         const FaultHook& fault) {
  SF_CHECK(c.config && c.layout && c.store, "save_checkpoint needs config, layout and store");
  const fs::path dir = checkpoint_path(out, step);
  fs::path tmp = dir;
  tmp += ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  auto hook = [&](std::string_view point) {
    if (fault) fault(cat(point, ":", step));
  };
  try {
    fs::create_directories(tmp / kResumeDir, ec);
    if (ec) SF_FAIL(io, tmp.string(), ": cannot create directory (", ec.message(), ")");
    std::vector<const float*> w;
    for (int u = 0; u < c.store->n_units(); ++u) w.push_back(c.store->master(u));
    write_model_files(tmp, *c.config, *c.layout, w, c.model);
    const nlohmann::json settings = c.trainer_state.value("settings", nlohmann::json::object());
    write_file_atomic(tmp / "README.md",
                      model_card_markdown(c.trainer_state, *c.config,
                                          settings.value("model", std::string())));
    hook("checkpoint:model-written");
    write_resume_tensors(tmp / kResumeDir, *c.layout, *c.store, step);
    fsync_dir(tmp / kResumeDir);
    // The state goes last: a directory whose state parses has everything else.
    write_file_atomic(tmp / kStateFile, c.trainer_state.dump(1) + "\n");
    hook("checkpoint:before-rename");
    replace_dir(tmp, dir);
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    SF_FAIL(io, "checkpoint ", dir.string(), " was not saved: ", e.what());
  } catch (const std::exception& e) {
    fs::remove_all(tmp, ec);
    SF_FAIL(io, "checkpoint ", dir.string(), " was not saved: ", e.what());
  }
  hook("checkpoint:before-latest");
  write_file_atomic(out / "latest", dir.filename().string() + "\n");
  return dir;
}

std::vector<CheckpointRef> list_checkpoints(const fs::path& out) {
  std::vector<CheckpointRef> r;
  std::error_code ec;
  for (auto it = fs::directory_iterator(out, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    auto step = parse_checkpoint_name(it->path().filename().string());
    if (!step || !it->is_directory(ec) || !state_parses(it->path())) continue;
    r.push_back({it->path(), *step});
  }
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return r;
}

std::optional<CheckpointRef> find_latest_checkpoint(const fs::path& out, std::string* note) {
  const fs::path latest = out / "latest";
  if (fs::exists(latest)) {
    std::string name;
    try {
      name = read_file(latest);
    } catch (const std::exception&) {
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
      name.pop_back();
    auto step = parse_checkpoint_name(name);
    if (step && state_parses(out / name)) return CheckpointRef{out / name, *step};
    if (note)
      *note = cat(latest.string(), " names \"", name,
                  "\", which is not a complete checkpoint; using the newest complete one");
  }
  auto all = list_checkpoints(out);
  if (all.empty()) return std::nullopt;
  return all.back();
}

void prune_checkpoints(const fs::path& out, int keep, const fs::path& protect) {
  if (keep <= 0) return;
  auto all = list_checkpoints(out);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    if (all[i].dir.filename() == protect.filename()) continue;
    fs::path gone = all[i].dir;
    gone += ".deleting." + std::to_string(::getpid());
    fs::rename(all[i].dir, gone, ec);
    if (!ec) fs::remove_all(gone, ec);
  }
}

void remove_checkpoint_temporaries(const fs::path& out) {
  std::error_code ec;
  std::vector<fs::path> junk;
  for (auto it = fs::directory_iterator(out, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    if (name.find(".tmp.") != std::string::npos || name.find(".old.") != std::string::npos ||
        name.find(".deleting.") != std::string::npos)
      junk.push_back(it->path());
  }
  for (auto& p : junk) fs::remove_all(p, ec);
}

nlohmann::json read_trainer_state(const fs::path& dir) {
  const fs::path p = dir / kStateFile;
  SF_REQUIRE(fs::exists(p), p.string(),
             ": not found; this is not a complete slideformer checkpoint");
  try {
    return nlohmann::json::parse(read_file(p));
  } catch (const nlohmann::json::exception& e) {
    SF_FAIL(input, p.string(), ": malformed JSON (", e.what(), ")");
  }
}

void load_resume_tensors(const fs::path& dir, const ModelLayout& layout, ParamStore& store) {
  SF_CHECK(int(layout.units.size()) == store.n_units(), "layout and store disagree");
  for (int which = 0; which < 3; ++which) {
    const fs::path p = dir / kResumeDir / kResumeFiles[which];
    SF_REQUIRE(fs::exists(p), p.string(), ": not found; the checkpoint has no resume state");
    SafetensorsFile f(p);
    SF_REQUIRE(f.tensors().size() == layout.units.size(), p.string(), ": holds ",
               f.tensors().size(), " tensors but this model has ", layout.units.size(),
               " units; the checkpoint belongs to another model shape");
    for (int u = 0; u < store.n_units(); ++u) {
      const std::string name = unit_name(layout, u);
      const TensorInfo* t = f.find(name);
      SF_REQUIRE(t, p.string(), ": tensor \"", name,
                 "\" is missing; the checkpoint belongs to another model shape");
      SF_REQUIRE(t->dtype == StDType::F32 && t->numel == store.numel(u), p.string(),
                 ": tensor \"", name, "\" is ", st_dtype_name(t->dtype), " ",
                 shape_str(t->shape), " but this model needs F32 [", store.numel(u),
                 "]; the checkpoint belongs to another model shape");
      float* dst = which == 0 ? store.master(u) : which == 1 ? store.m(u) : store.v(u);
      f.read_f32(*t, dst);
    }
  }
}

OutDirLock::OutDirLock(const fs::path& out) {
  const fs::path p = out / ".lock";
  fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SF_REQUIRE(fd_ >= 0, p.string(), ": cannot open (", std::strerror(errno),
             "); check that --out is writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    SF_FAIL(input, "another slideformer run is writing into ", out.string(),
            " (it holds ", p.string(), "); wait for it to finish or use another --out");
  }
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace sf
