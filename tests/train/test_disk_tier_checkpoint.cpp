// The disk tier (--optimizer-dir) under a failing disk: a sliding-window run with its AdamW
// moments streamed through the tier saves a checkpoint, then its optimizer disk fails (a
// file-size limit: every write of the tier past 4 KiB gets EFBIG, as a disk that stops taking
// writes would). The run stops with Error(io) naming --optimizer-dir and the errno text; the
// checkpoint's files are byte for byte what was saved and load back to the saved state. With
// the bf16 masters there too, a resumed run equals the straight one bit for bit.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <random>

#include "backend/host/host_backend.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"
#include "train/resume_state.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

Batch random_batch(const ModelConfig& cfg, int rows, int seq_len, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> r(static_cast<size_t>(rows));
  for (auto& row : r)
    for (int i = 0; i < seq_len; ++i) row.push_back(int32_t(g() % uint64_t(cfg.vocab_size)));
  return Batch::from_rows(r);
}

// Unit u's master, m and v as bytes (through the store's view outside the sweep).
std::vector<std::string> state_bytes(const ParamStore& s) {
  std::vector<std::string> out;
  for (int u = 0; u < s.n_units(); ++u) {
    const UnitStateView v = s.state(u);
    out.emplace_back(static_cast<const char*>(v.master), v.layout->master_bytes);
    out.emplace_back(static_cast<const char*>(v.m), v.layout->moment_bytes);
    out.emplace_back(static_cast<const char*>(v.v), v.layout->moment_bytes);
  }
  return out;
}

// Sets RLIMIT_FSIZE for its lifetime (SIGXFSZ ignored, else it ends the process).
struct FileSizeLimit {
  rlimit old{};
  void (*old_handler)(int) = nullptr;
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old);
    old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
  }
};

// A temporary directory holding the tier's directory and a checkpoint's resume directory.
struct TierDirs {
  TempDir tmp;
  fs::path moments, ckpt;
  explicit TierDirs(const char* name) : tmp{name}, moments(tmp.path / "moments"), ckpt(tmp.path / "checkpoint-2") {
    fs::create_directories(moments);
    fs::create_directories(ckpt / "resume");
  }
};

TEST(DiskTierCheckpoint, FailingOptimizerDiskLeavesTheCheckpointIntact) {
  const TierDirs dirs("sf-disk-tier");
  const fs::path &moments = dirs.moments, &ckpt = dirs.ckpt;
  const ModelConfig cfg = tiny_config(Arch::qwen3);
  const ModelLayout layout = ModelLayout::build(cfg);
  HostBackend be;
  EngineConfig ec;
  ec.max_chunk_tokens = 64;
  ec.moments_dir = moments.string();
  ec.moments_streamed = true;  // O_DIRECT where the filesystem has it
  SlidingWindowExecutor eng(be, cfg, ec);
  ASSERT_TRUE(eng.params().moments_on_disk());
  for (int u = 0; u < eng.params().n_units(); ++u) init_unit(layout.units[size_t(u)], eng.params().master(u), 7);
  eng.params_changed();
  OptimHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1f;
  auto step_on = [&](int step) {
    const std::vector<Batch> micro = {random_batch(cfg, 2, 16, uint64_t(step))};
    eng.train_step(micro, h);
  };
  for (int step = 0; step < 2; ++step) step_on(step);

  write_resume_tensors(ckpt / "resume", layout, eng.params(), eng.params().step);
  const std::vector<std::string> saved = state_bytes(eng.params());
  std::vector<std::string> files;
  for (const char* f : {"master.safetensors", "adam_m.safetensors", "adam_v.safetensors"})
    files.push_back(read_file(ckpt / "resume" / f));

  std::string msg;
  {
    FileSizeLimit limit(4096);
    try {
      for (int step = 2; step < 6; ++step) {
        step_on(step);
        eng.params();  // waits for the step's updates
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::io);
      msg = e.what();
    }
  }
  ASSERT_FALSE(msg.empty()) << "4 steps with the optimizer's disk refusing every write went through";
  EXPECT_NE(msg.find("--optimizer-dir " + moments.string()), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("File too large") != std::string::npos || msg.find("short write") != std::string::npos) << msg;

  int i = 0;
  for (const char* f : {"master.safetensors", "adam_m.safetensors", "adam_v.safetensors"})
    EXPECT_EQ(read_file(ckpt / "resume" / f), files[size_t(i++)]) << f << " changed after the failure";
  ParamStore back(state_units(layout));
  load_resume_tensors(ckpt, layout, back);
  const std::vector<std::string> loaded = state_bytes(back);
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t k = 0; k < saved.size(); ++k)
    EXPECT_TRUE(loaded[k] == saved[k]) << "unit " << k / 3 << " part " << k % 3 << " differs from the saved state";
}

// bf16 masters on the disk with their moments (int8): a run resumed from a checkpoint taken
// after 2 steps (loaded through the file's mapping into a fresh window with the same tier)
// equals the straight run bit for bit after 2 more, master, moments and scales.
TEST(DiskTierCheckpoint, MastersOnDiskResumeBitExact) {
  const TierDirs dirs("sf-disk-masters");
  const fs::path &moments = dirs.moments, &ckpt = dirs.ckpt;
  const ModelConfig cfg = tiny_config(Arch::llama);
  const ModelLayout layout = ModelLayout::build(cfg);
  EngineConfig ec;
  ec.max_chunk_tokens = 64;
  ec.state_format = StateFormat{MomentFormat::int8, MasterFormat::bf16};
  ec.moments_dir = moments.string();
  ec.moments_streamed = true;
  ec.masters_on_disk = true;
  OptimHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1f;
  h.max_grad_norm = 0.05f;  // clipped: the deferred update after the global norm
  auto step_on = [&](SlidingWindowExecutor& eng, int step) {
    const std::vector<Batch> micro = {random_batch(cfg, 2, 16, uint64_t(step))};
    eng.train_step(micro, h);
  };
  HostBackend be_a, be_b;
  SlidingWindowExecutor straight(be_a, cfg, ec);
  ASSERT_TRUE(straight.params().master_on_disk(1));
  std::vector<float> w;
  for (int u = 0; u < straight.params().n_units(); ++u) {
    w.assign(size_t(layout.units[size_t(u)].numel), 0.f);
    init_unit(layout.units[size_t(u)], w.data(), 7);
    straight.params().write_master_f32(u, w.data());
  }
  straight.params_changed();
  for (int step = 0; step < 2; ++step) step_on(straight, step);
  write_resume_tensors(ckpt / "resume", layout, straight.params(), straight.params().step);
  const int64_t saved_step = straight.params().step;
  for (int step = 2; step < 4; ++step) step_on(straight, step);

  SlidingWindowExecutor resumed(be_b, cfg, ec);
  load_resume_tensors(ckpt, layout, resumed.params());
  resumed.params().step = saved_step;  // the trainer's state file carries it (Trainer::build)
  resumed.params_changed();
  for (int step = 2; step < 4; ++step) step_on(resumed, step);
  const std::vector<std::string> a = state_bytes(straight.params()), b = state_bytes(resumed.params());
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_TRUE(a[k] == b[k]) << "unit " << k / 3 << " part " << k % 3 << " differs from the straight run";
  for (int u = 0; u < straight.params().n_units(); ++u) {
    const UnitStateView x = straight.params().state(u), y = resumed.params().state(u);
    const size_t scales = size_t(x.layout->scale_count) * 4;
    if (scales > 0) {
      EXPECT_EQ(0, std::memcmp(x.m_scale, y.m_scale, scales)) << u;
      EXPECT_EQ(0, std::memcmp(x.v_scale, y.v_scale, scales)) << u;
    }
  }
  EXPECT_EQ(straight.params().step, resumed.params().step);
}

}  // namespace
}  // namespace sf::test
