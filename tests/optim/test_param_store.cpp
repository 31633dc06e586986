// The training state's store: in RAM, or with the AdamW moments in a file on disk (mapped):
// zero at the start, read and written like memory, nothing left in the directory, and clear
// errors for a directory that cannot hold them. Compact formats: the bytes per parameter of
// each mode (8B targets), host_bytes == unit_state_bytes, the master in and out as fp32, the
// fp32 accessors refused, compact moments on disk.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include <filesystem>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "model/model_init.h"
#include "optim/param_store.h"
#include "optim/state_adamw.h"
#include "model/model_presets.h"
#include "model/param_layout.h"
#include "state_format_test_util.h"
#include "test_util.h"

using namespace sf;
namespace fs = std::filesystem;

namespace {

using sf::test::TempDir;

ModelLayout tiny_layout() { return ModelLayout::build(model_preset("tiny")); }

TEST(ParamStore, MomentsOnDiskAreZeroWritableAndLeaveNothingBehind) {
  TempDir dir;
  const ModelLayout layout = tiny_layout();
  {
    ParamStore ram(state_units(layout)), disk(state_units(layout), dir.path.string());
    EXPECT_FALSE(ram.moments_on_disk());
    EXPECT_TRUE(disk.moments_on_disk());
    // Only the master counts as RAM when the moments are on disk.
    EXPECT_EQ(disk.host_bytes() * 3, ram.host_bytes());
    for (int u = 0; u < disk.n_units(); ++u) {
      disk.prefetch_disk_unit(u);
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        ASSERT_EQ(disk.m(u)[i], 0.f);
        ASSERT_EQ(disk.v(u)[i], 0.f);
      }
      // Distinct, non-overlapping arrays: write a pattern everywhere, read it all back.
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        disk.m(u)[i] = float(u) + float(i) * 1e-3f;
        disk.v(u)[i] = -float(u) - float(i) * 1e-3f;
      }
    }
    for (int u = 0; u < disk.n_units(); ++u)
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        ASSERT_EQ(disk.m(u)[i], float(u) + float(i) * 1e-3f) << u << " " << i;
        ASSERT_EQ(disk.v(u)[i], -float(u) - float(i) * 1e-3f) << u << " " << i;
      }
    EXPECT_GE(disk_file_bytes(state_units(layout)), 2 * sizeof(float) * size_t(layout.total_numel()));
    // The file has no name: the directory stays empty while it is in use.
    EXPECT_TRUE(fs::is_empty(dir.path));
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

// Only some units' moments on disk: the layers first, spread evenly over the sweep, then the
// head, then the embedding; every count from none to all.
TEST(ParamStore, DiskUnitChoiceSpreadsTheLayersFirst) {
  const ModelLayout layout = ModelLayout::build(model_preset("llama3-8b"));
  const std::vector<StateUnit> units = state_units(layout);
  const int n = int(units.size()), layers = n - 2;
  for (int k = 0; k <= n + 1; ++k) {
    SCOPED_TRACE(k);
    const std::vector<char> on = disk_unit_choice(units, k);
    ASSERT_EQ(on.size(), units.size());
    int count = 0, last = 0, widest = 0;
    for (int u = 0; u < n; ++u) count += on[size_t(u)];
    EXPECT_EQ(count, std::min(k, n));
    for (int u = 1; u <= layers; ++u)
      if (on[size_t(u)]) {
        widest = std::max(widest, u - last);
        last = u;
      }
    const int chosen_layers = std::min(k, layers);
    if (chosen_layers > 0) {
      EXPECT_LE(widest, (layers + chosen_layers - 1) / chosen_layers) << "not spread";
    }
    EXPECT_EQ(bool(on[size_t(n - 1)]), k > layers) << "the head before all layers";
    EXPECT_EQ(bool(on[0]), k >= n) << "the embedding last";
  }
  EXPECT_EQ(disk_unit_choice(units, -1), std::vector<char>(units.size(), 1));
}

// Some units on disk, the rest in RAM: each unit's moments read and write like memory
// through the sweep's calls (no-ops for those in RAM), RAM and file bytes as counted.
TEST(ParamStore, SomeUnitsOnDiskTheRestInRam) {
  TempDir dir;
  const ModelLayout layout = tiny_layout();
  const std::vector<StateUnit> units = state_units(layout);
  for (StateFormat f : {StateFormat{}, StateFormat{MomentFormat::int8, MasterFormat::bf16}}) {
    ParamStore ram(units, f), part(units, f, dir.path.string(), true, {1});
    const std::vector<char> on = disk_unit_choice(units, 1);
    size_t ram_moments_on_disk = 0;
    for (int u = 0; u < part.n_units(); ++u) {
      EXPECT_EQ(part.moments_on_disk(u), bool(on[size_t(u)])) << u;
      if (on[size_t(u)]) ram_moments_on_disk += 2 * part.layout(u).moment_bytes;
    }
    EXPECT_EQ(part.host_bytes() + ram_moments_on_disk, ram.host_bytes());
    EXPECT_GE(disk_file_bytes(units, f, {1}), ram_moments_on_disk);
    EXPECT_LT(disk_file_bytes(units, f, {1}), disk_file_bytes(units, f));
    for (int u = 0; u < part.n_units(); ++u) {  // a pattern through the sweep's calls
      part.prefetch_disk_unit(u);
      part.acquire_disk_unit(u);
      UnitStateView st = part.state(u);
      const size_t b = part.layout(u).moment_bytes;
      std::memset(st.m, 0x10 + u, b);
      std::memset(st.v, 0x40 + u, b);
      part.disk_unit_done(u);
    }
    part.flush_disk();
    for (int u = 0; u < part.n_units(); ++u) {
      const UnitStateView st = part.state(u);
      const size_t b = part.layout(u).moment_bytes;
      for (size_t i = 0; i < b; i += 97) {
        ASSERT_EQ(static_cast<const unsigned char*>(st.m)[i], 0x10 + u) << u << " " << i;
        ASSERT_EQ(static_cast<const unsigned char*>(st.v)[i], 0x40 + u) << u << " " << i;
      }
    }
  }
}

TEST(ParamStore, ClearErrorsForADirectoryThatCannotHoldTheMoments) {
  const ModelLayout layout = tiny_layout();
  try {
    ParamStore s(state_units(layout), "/nonexistent/sf-moments");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("--optimizer-dir /nonexistent/sf-moments"), std::string::npos)
        << e.what();
  }
  // A file size limit (as a full disk would) refuses the reservation up front, not later as
  // SIGBUS in an optimizer sweep.
  {
    TempDir dir;
    struct rlimit old {};
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 1 << 20;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    std::string msg;
    try {
      ParamStore s(state_units(layout), dir.path.string());
    } catch (const Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_NE(msg.find("cannot reserve"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free space on " + dir.path.string() + " or choose another --optimizer-dir"), std::string::npos) << msg;
    EXPECT_TRUE(fs::is_empty(dir.path));
  }
  EXPECT_GT(disk_free_bytes(fs::temp_directory_path().string()), 0u);
  EXPECT_EQ(disk_free_bytes("/nonexistent/sf-moments"), 0u);
}

}  // namespace

namespace {

// Streamed moments: once the next unit is done, a unit's moments are on disk and out of the
// page cache (mincore), and read back unchanged.
TEST(ParamStore, StreamedMomentsAreWrittenAndDroppedBehindTheSweep) {
  TempDir dir;
  const ModelLayout layout = tiny_layout();
  ParamStore s(state_units(layout), dir.path.string(), true);
  ASSERT_TRUE(s.moments_on_disk());
  for (int u = 0; u < s.n_units(); ++u) {
    s.prefetch_disk_unit(u);
    for (int64_t i = 0; i < s.numel(u); ++i) {
      s.m(u)[i] = 0.5f + float(i % 97);
      s.v(u)[i] = 2.0f + float(u);
    }
    s.disk_unit_done(u);
  }
  // Unit 0 (the embedding, the largest) was dropped when unit 1 was done.
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t bytes = size_t(s.numel(0)) * 4;
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ASSERT_EQ(::mincore(s.m(0), bytes, resident.data()), 0);
  size_t in_core = 0;
  for (unsigned char r : resident) in_core += r & 1;
  EXPECT_LT(in_core, resident.size() / 4) << in_core << " of " << resident.size() << " pages";
  for (int u = 0; u < s.n_units(); ++u)
    for (int64_t i = 0; i < s.numel(u); ++i) {
      ASSERT_EQ(s.m(u)[i], 0.5f + float(i % 97)) << u << " " << i;
      ASSERT_EQ(s.v(u)[i], 2.0f + float(u)) << u << " " << i;
    }
}

}  // namespace

// ---- compact formats -----------------------------------------------------------------------

namespace {

const auto& kModes = sf::test::kAllStateFormats;
std::string mode_name(StateFormat f) { return sf::test::state_format_label(f); }
ModelLayout compact_layout() { return ModelLayout::build(sf::test::compact_config()); }

size_t state_bytes(const std::vector<StateUnit>& units, StateFormat f) {
  size_t n = 0;
  for (auto& u : units) n += unit_state_bytes(u, f);
  return n;
}

// Issue 18's targets, counted on the real 8B unit list (sizes only, nothing allocated).
TEST(ParamStoreFormats, BytesPerParameterOfLlama3_8b) {
  const ModelConfig cfg = model_preset("llama3-8b");
  const ModelLayout layout = ModelLayout::build(cfg);
  const std::vector<StateUnit> units = state_units(layout);
  const double params = double(cfg.num_parameters());
  auto per_param = [&](MomentFormat m, MasterFormat w) { return double(state_bytes(units, {m, w})) / params; };
  // fp32: 12 bytes for every element of the unit buffers (padding included), as always.
  EXPECT_EQ(state_bytes(units, {}), 12 * size_t(layout.total_numel()));
  EXPECT_LE(per_param(MomentFormat::int8, MasterFormat::f32), 6.1);
  EXPECT_LE(per_param(MomentFormat::int8, MasterFormat::bf16), 4.1);
  EXPECT_LE(per_param(MomentFormat::bf16, MasterFormat::bf16), 6.01);  // 2 + 2 + 2, padding
  // The file of moments on disk holds exactly the compact moments (page-aligned per unit).
  for (MomentFormat m : {MomentFormat::f32, MomentFormat::bf16, MomentFormat::int8}) {
    size_t moments = 0;
    for (auto& u : units) moments += 2 * unit_state_layout(u, {m, MasterFormat::f32}).moment_bytes;
    const size_t file = disk_file_bytes(units, {m, MasterFormat::f32});
    EXPECT_GE(file, moments);
    EXPECT_LT(file, moments + units.size() * 2 * 4096) << moment_format_name(m);
  }
  EXPECT_EQ(disk_file_bytes(units), disk_file_bytes(units, {}));
}

// What the store allocates is what the planner counts: unit_state_bytes, unit by unit.
TEST(ParamStoreFormats, HostBytesAreTheSumOfUnitStateBytes) {
  const std::vector<StateUnit> units = state_units(compact_layout());
  bool saw_int8 = false, saw_small = false;
  for (StateFormat f : kModes) {
    ParamStore s(units, f);
    EXPECT_EQ(s.format(), f);
    EXPECT_EQ(s.host_bytes(), state_bytes(units, f)) << mode_name(f);
    for (int u = 0; u < s.n_units(); ++u) {
      const UnitStateView v = s.state(u);
      EXPECT_EQ(v.layout, &s.layout(u));
      EXPECT_EQ(v.format, f);
      EXPECT_EQ(v.unit, u);
      EXPECT_EQ(v.rounding_seed, s.rounding_seed);
      EXPECT_EQ((v.m_scale != nullptr), f.moments == MomentFormat::int8 && v.layout->scale_count > 0);
      for (auto& r : v.layout->ranges) {
        saw_int8 |= r.moments == MomentFormat::int8;
        saw_small |= f.moments == MomentFormat::int8 && r.moments == MomentFormat::f32;
      }
    }
  }
  EXPECT_TRUE(saw_int8 && saw_small) << "the test layout must have int8 and fp32 ranges";
  // The rounding seed follows the store's field.
  ParamStore s(units, kModes[5]);
  s.rounding_seed = 42;
  EXPECT_EQ(s.state(1).rounding_seed, 42u);
}

// The model's weights in and out of every format: fp32 bit for bit, bf16 rounded to nearest
// even on the way in and decoded exactly on the way out.
TEST(ParamStoreFormats, MasterWeightsRoundTripThroughFp32) {
  const std::vector<StateUnit> units = state_units(compact_layout());
  for (StateFormat f : kModes) {
    ParamStore s(units, f);
    for (int u = 0; u < s.n_units(); ++u) {
      const size_t n = size_t(s.numel(u));
      const std::vector<float> in = test::random_vec(n, 100 + uint64_t(u), -2.f, 2.f);
      s.write_master_f32(u, in.data());
      std::vector<float> out(n, -7.f);
      s.read_master_f32(u, out.data());
      for (size_t i = 0; i < n; ++i) {
        const float want = f.master == MasterFormat::f32 ? in[i] : round_bf16(in[i]);
        ASSERT_EQ(0, std::memcmp(&out[i], &want, 4)) << mode_name(f) << " unit " << u << " " << i;
      }
      if (f.master == MasterFormat::bf16) {
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(s.master_bf16(u)[i], f32_to_bf16(in[i]));
        // Values a bf16 holds exactly come back unchanged (a bf16 model loads losslessly).
        std::vector<float> again(n);
        s.write_master_f32(u, out.data());
        s.read_master_f32(u, again.data());
        EXPECT_EQ(0, std::memcmp(again.data(), out.data(), n * 4));
      } else {
        EXPECT_EQ(0, std::memcmp(s.master(u), in.data(), n * 4));
      }
    }
  }
}

template <class F>
std::string internal_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind() == ErrorKind::internal ? e.what() : std::string("wrong kind: ") + e.what();
  }
  return "no error";
}

// The fp32 arrays exist only where the format has them: a caller still on them in a compact
// run fails at once, saying what to use.
TEST(ParamStoreFormats, Fp32AccessorsRefuseOtherFormats) {
  const std::vector<StateUnit> units = state_units(compact_layout());
  ParamStore int8_bf16(units, kModes[5]), fp32(units);
  EXPECT_NE(internal_error([&] { int8_bf16.master(0); }).find("read_master_f32"), std::string::npos);
  EXPECT_NE(internal_error([&] { int8_bf16.m(1); }).find("are int8, not fp32; use state(u)"),
            std::string::npos) << internal_error([&] { int8_bf16.m(1); });
  EXPECT_NE(internal_error([&] { int8_bf16.v(1); }).find("use state(u)"), std::string::npos);
  EXPECT_NE(internal_error([&] { int8_bf16.master_ptrs(); }).find("bf16"), std::string::npos);
  EXPECT_NE(internal_error([&] { fp32.master_bf16(0); }).find("not bf16"), std::string::npos);
  EXPECT_EQ(fp32.m(0), static_cast<float*>(fp32.state(0).m));
  EXPECT_EQ(fp32.master_ptrs()[1], fp32.master(1));
  ParamStore bf16_moments(units, kModes[1]);
  EXPECT_NE(internal_error([&] { bf16_moments.m(0); }).find("bf16"), std::string::npos);
  EXPECT_NO_THROW(bf16_moments.master(0));
}

// A new store's state is zero in every format (moments as the optimizer's first step needs
// them; an all-zero int8 block has scale 0, so any code decodes to 0).
TEST(ParamStoreFormats, NewStateIsZeroInEveryFormat) {
  const std::vector<StateUnit> units = state_units(compact_layout());
  for (StateFormat f : kModes) {
    ParamStore s(units, f);
    for (int u = 0; u < s.n_units(); ++u) {
      const size_t n = size_t(s.numel(u));
      std::vector<float> w(n, 1.f), m(n, 1.f), v(n, 1.f);
      state_to_f32(s.state(u), 0, s.numel(u), w.data(), m.data(), v.data(), s.ranges(u));
      for (auto& r : s.ranges(u))
        for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
          ASSERT_TRUE(w[size_t(i)] == 0.f && m[size_t(i)] == 0.f && v[size_t(i)] == 0.f)
              << mode_name(f) << " unit " << u << " element " << i;
    }
  }
}

// Compact moments in the file: the same bytes as in RAM, only the master and the int8 scales
// counted as RAM.
TEST(ParamStoreFormats, CompactMomentsOnDiskHoldTheSameBytes) {
  TempDir dir;
  const std::vector<StateUnit> units = state_units(compact_layout());
  for (StateFormat f : {kModes[1], kModes[5]}) {
    ParamStore ram(units, f), disk(units, f, dir.path.string());
    ASSERT_TRUE(disk.moments_on_disk());
    size_t in_ram = 0;
    for (int u = 0; u < disk.n_units(); ++u)
      in_ram += disk.layout(u).master_bytes + 2 * size_t(disk.layout(u).scale_count) * 4;
    EXPECT_EQ(disk.host_bytes(), in_ram) << mode_name(f);
    for (int u = 0; u < ram.n_units(); ++u) {
      const size_t n = size_t(ram.numel(u));
      const auto w = test::random_vec(n, 7, -1.f, 1.f), m = test::random_vec(n, 8, -0.1f, 0.1f),
                 v = test::random_vec(n, 9, 0.f, 0.01f);
      for (ParamStore* s : {&ram, &disk}) {
        s->prefetch_disk_unit(u);
        state_from_f32(s->state(u), 0, s->numel(u), w.data(), m.data(), v.data(), s->ranges(u));
        s->disk_unit_done(u);
      }
    }
    for (int u = 0; u < ram.n_units(); ++u) {
      const UnitStateView a = ram.state(u), b = disk.state(u);
      const size_t mb = a.layout->moment_bytes, sb = size_t(a.layout->scale_count) * 4;
      EXPECT_EQ(0, std::memcmp(a.m, b.m, mb)) << mode_name(f) << " unit " << u;
      EXPECT_EQ(0, std::memcmp(a.v, b.v, mb)) << mode_name(f) << " unit " << u;
      if (sb) {
        EXPECT_EQ(0, std::memcmp(a.m_scale, b.m_scale, sb));
        EXPECT_EQ(0, std::memcmp(a.v_scale, b.v_scale, sb));
      }
    }
    EXPECT_TRUE(fs::is_empty(dir.path));
  }
}

// bf16 masters in the file with their units' moments (DiskUnits::masters): never the
// embedding's; RAM and file bytes as counted; the same bytes as a store in RAM through the
// sweep's slots, and both views (the slot's, the mapping's) agree with the file both ways.
TEST(ParamStoreFormats, MastersOnDiskMoveWithTheirMoments) {
  TempDir dir;
  const std::vector<StateUnit> units = state_units(compact_layout());
  const int n = int(units.size());
  for (StateFormat f : {kModes[3], kModes[5]}) {
    for (int count : {-1, 2}) {
      for (bool streamed : {false, true}) {
        SCOPED_TRACE(cat(mode_name(f), " units ", count, streamed ? " streamed" : " cached"));
        const DiskUnits both{count, true};
        ParamStore ram(units, f), disk(units, f, dir.path.string(), streamed, both);
        const std::vector<char> on = disk_unit_choice(units, count), masters = master_disk_choice(units, both);
        size_t to_file = 0, master_file = 0;
        for (int u = 0; u < n; ++u) {
          EXPECT_EQ(disk.moments_on_disk(u), bool(on[size_t(u)])) << u;
          EXPECT_EQ(disk.master_on_disk(u), bool(on[size_t(u)]) && u > 0) << u;
          EXPECT_EQ(bool(masters[size_t(u)]), disk.master_on_disk(u)) << u;
          if (on[size_t(u)]) to_file += 2 * disk.layout(u).moment_bytes;
          if (disk.master_on_disk(u)) master_file += disk.layout(u).master_bytes;
        }
        EXPECT_FALSE(disk.master_on_disk(0)) << "the embedding's table stays in RAM";
        EXPECT_GT(master_file, 0u);
        EXPECT_EQ(disk.host_bytes() + to_file + master_file, ram.host_bytes());
        EXPECT_GE(disk_file_bytes(units, f, both), disk_file_bytes(units, f, {count}) + master_file);
        EXPECT_GT(disk_slot_bytes(units, f, both), disk_slot_bytes(units, f, {count}));
        for (int u = 0; u < n; ++u) {  // through the sweep's slots
          const size_t k = size_t(ram.numel(u));
          const auto w = test::random_vec(k, 17 + u, -1.f, 1.f), m = test::random_vec(k, 18 + u, -0.1f, 0.1f),
                     v = test::random_vec(k, 19 + u, 0.f, 0.01f);
          for (ParamStore* s : {&ram, &disk}) {
            s->prefetch_disk_unit(u);
            s->acquire_disk_unit(u);
            state_from_f32(s->state(u), 0, s->numel(u), w.data(), m.data(), v.data(), s->ranges(u));
            s->disk_unit_done(u);
          }
        }
        disk.flush_disk();
        for (int u = 0; u < n; ++u) {  // through the mapping
          const UnitStateView a = ram.state(u), b = disk.state(u);
          ASSERT_EQ(0, std::memcmp(a.master, b.master, a.layout->master_bytes)) << u;
          ASSERT_EQ(0, std::memcmp(a.m, b.m, a.layout->moment_bytes)) << u;
          ASSERT_EQ(0, std::memcmp(a.v, b.v, a.layout->moment_bytes)) << u;
          ASSERT_EQ(0, std::memcmp(ram.master_bf16(u), disk.master_bf16(u), a.layout->master_bytes)) << u;
        }
        for (int u = 0; u < n; ++u) {  // written through the mapping, read in the slot
          const auto w = test::random_vec(size_t(disk.numel(u)), 31 + u, -2.f, 2.f);
          disk.write_master_f32(u, w.data());
          ram.write_master_f32(u, w.data());
          disk.prefetch_disk_unit(u);
          disk.acquire_disk_unit(u);
          ASSERT_EQ(0, std::memcmp(disk.state(u).master, ram.master_bf16(u), disk.layout(u).master_bytes)) << u;
          disk.disk_unit_done(u);
        }
        std::vector<float> x(size_t(disk.numel(1))), y(x.size());
        disk.read_master_f32(1, x.data());
        ram.read_master_f32(1, y.data());
        EXPECT_EQ(x, y);
      }
    }
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
  // Only a bf16 master, and only with a directory.
  EXPECT_THROW(ParamStore(units, kModes[2], dir.path.string(), false, DiskUnits{-1, true}), Error);
  EXPECT_THROW(ParamStore(units, kModes[5], "", false, DiskUnits{-1, true}), Error);
}

// A master on disk written or read through the mapping (a model's init, a refresh of the
// homes, a checkpoint) leaves the process once settled: the resident set does not keep the
// masters' pages (in a run they would count against --host-memory until the next sweep).
TEST(ParamStoreFormats, SettledMastersOnDiskLeaveTheResidentSet) {
  TempDir dir;
  ModelConfig c = sf::test::compact_config();
  c.hidden_size = 512;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 4;
  const std::vector<StateUnit> units = state_units(ModelLayout::build(c));
  ParamStore disk(units, kModes[5], dir.path.string(), false, DiskUnits{-1, true});
  size_t master_bytes = 0, largest = 0;
  for (int u = 0; u < disk.n_units(); ++u) {
    if (disk.master_on_disk(u)) master_bytes += disk.layout(u).master_bytes;
    largest = std::max(largest, size_t(disk.numel(u)));
  }
  ASSERT_GT(master_bytes, size_t(16) << 20);
  std::vector<float> w = test::random_vec(largest, 5, -1.f, 1.f);  // touched before the baseline
  const size_t before = process_memory().rss_bytes;
  for (int u = 0; u < disk.n_units(); ++u) disk.write_master_f32(u, w.data());  // settles itself
  const size_t after_write = process_memory().rss_bytes;
  uint64_t sum = 0;
  for (int u = 1; u < disk.n_units(); ++u) {
    const uint16_t* m = disk.master_bf16(u);
    for (int64_t i = 0; i < disk.numel(u); i += 512) sum += m[i];  // every page read
    disk.settle_mapping(u);
  }
  const size_t after_read = process_memory().rss_bytes;
  EXPECT_GT(sum, 0u);
  EXPECT_LT(after_write, before + master_bytes / 4) << "written masters stayed resident";
  EXPECT_LT(after_read, before + master_bytes / 4) << "read masters stayed resident";
  for (int u = 1; u < disk.n_units(); ++u) {  // and the file has what was written
    std::vector<float> back(size_t(disk.numel(u)));
    disk.read_master_f32(u, back.data());
    for (size_t i = 0; i < back.size(); i += 997) ASSERT_EQ(back[i], bf16_to_f32(f32_to_bf16(w[i]))) << u;
  }
}

}  // namespace
