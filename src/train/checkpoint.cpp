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

// The store's weights as the HF files take them: pointers into the store (fp32 master, or a
// bf16 master saved as bf16: its exact bits), else an fp32 copy of a bf16 master in `scratch`
// (4 B/param while the save runs; only for a bf16 master saved as f32 or f16).
UnitWeights model_weights(const ParamStore& st, DType dtype, std::vector<std::vector<float>>& scratch) {
  UnitWeights w;
  const bool bf16_master = st.format().master == MasterFormat::bf16;
  for (int u = 0; u < st.n_units(); ++u) {
    if (!bf16_master) {
      w.f32.push_back(st.master(u));
    } else if (dtype == DType::bf16) {
      w.bf16.push_back(st.master_bf16(u));
    } else {
      scratch.emplace_back(size_t(st.numel(u)));
      st.read_master_f32(u, scratch.back().data());
      w.f32.push_back(scratch.back().data());
    }
  }
  return w;
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
    std::vector<std::vector<float>> scratch;
    write_model_files(tmp, *c.config, *c.layout, model_weights(*c.store, c.model.dtype, scratch),
                      c.model);
    scratch.clear();
    const nlohmann::json settings = c.trainer_state.value("settings", nlohmann::json::object());
    write_file_atomic(tmp / "README.md",
                      model_card_markdown(c.trainer_state, *c.config,
                                          settings.value("model", std::string())));
    hook("checkpoint:model-written");
    write_resume_tensors(tmp / kResumeDir, *c.layout, *c.store, step);
    // State on disk was read through the file's mapping: its pages leave this process now
    // (clean and reclaimable meanwhile, they counted as RSS while the files were written).
    for (int u = 0; u < c.store->n_units(); ++u) c.store->settle_mapping(u);
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
