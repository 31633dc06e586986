// StateDisk (optim/state_disk.h): units of opaque parts stream through N slots exactly (several
// sweeps, every slot busy, prefetches waiting for write-backs, the updates on another thread);
// checkpoint access (unchanged reads, overwrites) in between; a slot deadlock is a clear bug
// report; injected faults and a full filesystem are Error(io) with the message, kept for every
// later call. ParamStore over the tier: the sweep's slots and the mapping that other readers
// get always agree (in both directions, both modes).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "model/model_presets.h"
#include "model/param_layout.h"
#include "optim/param_store.h"
#include "optim/state_disk.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

// Units like a model's: uneven (an embedding-like first unit), two parts (m, v) of unaligned
// sizes, one with a zero-sized third part; ~20 MiB in all.
std::vector<std::vector<size_t>> model_like_units() {
  std::vector<std::vector<size_t>> u;
  u.push_back({size_t(3) << 20, size_t(3) << 20});
  for (int i = 0; i < 10; ++i) u.push_back({(size_t(700) << 10) + 4 * size_t(i * 37 + 1), (size_t(700) << 10) + 4 * size_t(i)});
  u.push_back({1000, 1000, 0});
  return u;
}

DirectFileOptions small_requests() {
  DirectFileOptions o;
  o.request_bytes = 128 << 10;
  o.queue_depth = 4;
  return o;
}

// The bytes sweep `sweep` leaves in part p of unit u (sweep 0: the file's zeros).
uint8_t pattern(int sweep, int u, int p, size_t i) {
  if (sweep == 0) return 0;
  return uint8_t((i * 2654435761u) >> 13) ^ uint8_t(sweep * 31 + u * 7 + p);
}

void check_and_fill(const UnitBytes& b, int u, int have, int next) {
  for (int p = 0; p < b.n_parts; ++p) {
    const auto* x = reinterpret_cast<uint8_t*>(b.part[size_t(p)]);
    for (size_t i = 0; i < b.bytes[size_t(p)]; ++i)
      ASSERT_EQ(x[i], pattern(have, u, p, i)) << "unit " << u << " part " << p << " byte " << i << " sweep " << have;
    auto* w = reinterpret_cast<uint8_t*>(b.part[size_t(p)]);
    if (next != have)
      for (size_t i = 0; i < b.bytes[size_t(p)]; ++i) w[i] = pattern(next, u, p, i);
  }
}

// One optimizer sweep in `order`: prefetch the next unit, acquire, update, release.
void sweep(StateDisk& d, const std::vector<int>& order, int have, int next) {
  d.prefetch(order[0]);
  for (size_t k = 0; k < order.size(); ++k) {
    if (k + 1 < order.size()) d.prefetch(order[k + 1]);
    const int u = order[k];
    const UnitBytes b = d.acquire(u);
    check_and_fill(b, u, have, next);
    d.release(u);
  }
}

class StateDiskSlots : public ::testing::TestWithParam<int> {};

TEST_P(StateDiskSlots, SweepsRoundTripEveryByte) {
  const auto units = model_like_units();
  StateDisk d(::testing::TempDir(), units, GetParam(), small_requests());
  EXPECT_EQ(d.file_bytes(), StateDisk::file_bytes_for(units));
  EXPECT_EQ(d.slot_bytes(), size_t(6) << 20);
  std::vector<int> fwd, bwd;
  for (int u = 0; u < d.n_units(); ++u) fwd.push_back(u);
  bwd.assign(fwd.rbegin(), fwd.rend());
  sweep(d, fwd, 0, 1);
  sweep(d, bwd, 1, 2);  // the other way: the first units come from clean slots
  // The third sweep on another thread, as the engine's update thread runs it.
  std::thread t([&] { sweep(d, fwd, 2, 3); });
  t.join();
  d.flush();
  // A checkpoint's save: every unit read, none written; then its resume overwrites them all.
  for (int u : bwd) {
    check_and_fill(d.acquire(u), u, 3, 3);
    d.release(u, SlotRelease::unchanged);
  }
  for (int u : fwd) {
    const UnitBytes b = d.acquire(u, SlotFill::overwrite);
    for (int p = 0; p < b.n_parts; ++p)
      for (size_t i = 0; i < b.bytes[size_t(p)]; ++i) reinterpret_cast<uint8_t*>(b.part[size_t(p)])[i] = pattern(4, u, p, i);
    d.release(u);
  }
  sweep(d, fwd, 4, 5);
  sweep(d, fwd, 5, 5);
}

INSTANTIATE_TEST_SUITE_P(Slots, StateDiskSlots, ::testing::Values(1, 2, 3));

TEST(StateDisk, PrefetchWaitsForAWriteBackNotTheCaller) {
  StateDisk d(::testing::TempDir(), model_like_units(), 2, small_requests());
  d.prefetch(1);
  d.prefetch(2);
  d.prefetch(3);  // no slot: queued
  check_and_fill(d.acquire(1), 1, 0, 1);
  check_and_fill(d.acquire(2), 2, 0, 1);
  d.release(1);  // its write-back frees the slot unit 3 waits for
  check_and_fill(d.acquire(3), 3, 0, 1);
  d.release(2);
  d.release(3);
  d.prefetch(1);  // written back and clean, or still being written: either way, the new bytes
  check_and_fill(d.acquire(1), 1, 1, 1);
  d.release(1, SlotRelease::unchanged);
  d.flush();
}

// A caller may prefetch units it then does not update (speculation that stops): their copies
// give the slots up to the next units instead of holding them forever.
TEST(StateDisk, PrefetchedButUnusedCopiesGiveTheirSlotsUp) {
  StateDisk d(::testing::TempDir(), model_like_units(), 2, small_requests());
  d.prefetch(1);
  d.prefetch(2);
  check_and_fill(d.acquire(3), 3, 0, 1);  // took one of the two ready copies' slots
  d.release(3);
  check_and_fill(d.acquire(4), 4, 0, 1);
  d.release(4);
  check_and_fill(d.acquire(1), 1, 0, 0);  // read again where its copy went
  d.release(1, SlotRelease::unchanged);
  check_and_fill(d.acquire(3), 3, 1, 1);
  d.release(3, SlotRelease::unchanged);
  d.flush();
}

// Evicting a unit leaves the file alone holding it: the next acquire reads it back from there.
TEST(StateDisk, EvictWaitsForTheWriteBackAndDropsTheCopy) {
  StateDisk d(::testing::TempDir(), model_like_units(), 2, small_requests());
  check_and_fill(d.acquire(5), 5, 0, 1);
  d.release(5);
  d.prefetch(6);
  d.evict(5);  // written first
  d.evict(6);  // a prefetched copy goes too
  d.evict(7);  // nothing to drop
  check_and_fill(d.acquire(5), 5, 1, 1);
  EXPECT_THROW(d.evict(5), Error);  // acquired
  d.release(5, SlotRelease::unchanged);
}

TEST(StateDisk, AllSlotsHeldIsABugReportNotAHang) {
  StateDisk d(::testing::TempDir(), model_like_units(), 2, small_requests());
  d.acquire(1);
  d.acquire(2);
  try {
    d.acquire(3);
    FAIL() << "acquired a third unit with two slots held";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::internal);
    EXPECT_NE(std::string(e.what()).find("all 2 are acquired"), std::string::npos) << e.what();
  }
  d.release(1);
  d.acquire(3);  // the queued prefetch got the freed slot
  EXPECT_THROW(d.acquire(3), Error);  // twice
  EXPECT_THROW(d.release(4), Error);  // never acquired
}

struct Fault {
  const char* name;
  IoOp op;
  IoFault fault;
  const char* text;
};

class StateDiskFault : public ::testing::TestWithParam<Fault> {};

// A fault in unit 4's transfer (mid-sweep): the next call that waits throws Error(io) with the
// message, and so does every call after it.
TEST_P(StateDiskFault, IsStickyErrorIo) {
  const Fault& c = GetParam();
  const std::string dir = ::testing::TempDir();
  StateDisk d(dir, model_like_units(), 2, small_requests());
  std::vector<int> fwd;
  for (int u = 0; u < d.n_units(); ++u) fwd.push_back(u);
  sweep(d, fwd, 0, 1);
  d.flush();
  const auto units = model_like_units();
  const size_t bad = StateDisk::file_bytes_for({units.begin(), units.begin() + 4});  // unit 4's first request
  d.set_fault_hook_for_test([&](IoOp op, size_t off, size_t) { return op == c.op && off == bad ? c.fault : IoFault{}; });
  std::string msg;
  try {
    sweep(d, fwd, 1, 2);
    d.flush();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    msg = e.what();
  }
  ASSERT_NE(msg, "") << "the fault went unnoticed";
  EXPECT_NE(msg.find("--optimizer-dir " + dir), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.text), std::string::npos) << msg;
  EXPECT_NE(msg.find("choose another --optimizer-dir"), std::string::npos) << msg;
  d.set_fault_hook_for_test(nullptr);
  for (auto call : {+[](StateDisk& s) { s.prefetch(0); }, +[](StateDisk& s) { s.acquire(0); },
                    +[](StateDisk& s) { s.flush(); }}) {
    try {
      call(d);
      ADD_FAILURE() << "a call after the failure went through";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::io);
      EXPECT_EQ(std::string(e.what()), msg);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, StateDiskFault,
                         ::testing::Values(Fault{"enospc_write", IoOp::write, IoFault{ENOSPC}, "No space left on device"},
                                           Fault{"short_write", IoOp::write, IoFault{0, 4096}, "short write"},
                                           Fault{"eio_read", IoOp::read, IoFault{EIO}, "Input/output error"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(StateDisk, FullFilesystemFailsBeforeTheRun) {
  const fs::path mnt = fs::path(::testing::TempDir()) / ("sf-state-tmpfs-" + std::to_string(::getpid()));
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0) {
    const int e = errno;
    fs::remove(mnt);
    GTEST_SKIP() << "cannot mount an 8 MiB tmpfs here (" << std::strerror(e)
                 << "; needs root); tests/io's RlimitFullDiskFailsAtConstruction covers the reservation";
  }
  std::string msg;
  try {
    StateDisk d(mnt.string(), model_like_units(), 2, small_requests());  // ~20 MiB
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    msg = e.what();
  }
  ::umount(mnt.c_str());
  fs::remove(mnt);
  EXPECT_NE(msg.find("cannot reserve"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
}

TEST(StateDisk, TierSecondsReadThenWriteEveryByte) {
  // 8 GB at 4 GB/s read and 2 GB/s write, one after the other: 2 + 4 s; at a mixed 4 GB/s
  // (reads plus writes): 16 GB / 4 = 4 s; 2 GB of first and last units add 0.25 + 0.5 s.
  // (DOUBLE_EQ: a few ulps of the divisions.)
  EXPECT_DOUBLE_EQ(disk_tier_seconds(size_t(8e9), DiskRates{4e9, 2e9, 0}), 6.0);
  EXPECT_DOUBLE_EQ(disk_tier_seconds(size_t(8e9), DiskRates{4e9, 2e9, 4e9}), 4.0);
  EXPECT_DOUBLE_EQ(disk_tier_seconds(size_t(8e9), DiskRates{4e9, 2e9, 4e9}, size_t(2e9)), 4.75);
  EXPECT_THROW(disk_tier_seconds(1, DiskRates{0, 1, 0}), Error);
}

// The value sweep k leaves at element i of unit u's m (v: its negative).
float moment_value(int k, int u, int64_t i) { return k == 0 ? 0.f : float(k) + float(u) * 0.25f + float(i % 101) * 1e-3f; }

void sweep_store(ParamStore& s, int have, int next, bool through_slots) {
  for (int u = 0; u < s.n_units(); ++u) {
    if (through_slots) {
      if (u == 0) s.prefetch_disk_unit(0);
      if (u + 1 < s.n_units()) s.prefetch_disk_unit(u + 1);
      s.acquire_disk_unit(u);
    }
    float *m = s.m(u), *v = s.v(u);
    for (int64_t i = 0; i < s.numel(u); ++i) {
      ASSERT_EQ(m[i], moment_value(have, u, i)) << "unit " << u << " element " << i << " sweep " << have;
      ASSERT_EQ(v[i], -moment_value(have, u, i)) << "unit " << u << " element " << i << " sweep " << have;
      m[i] = moment_value(next, u, i);
      v[i] = -moment_value(next, u, i);
    }
    s.disk_unit_done(u);
  }
}

class StoreOnTier : public ::testing::TestWithParam<bool> {};  // streamed (O_DIRECT) or cached

TEST_P(StoreOnTier, SlotsAndMappingAgree) {
  const ModelLayout layout = ModelLayout::build(model_preset("tiny"));
  ParamStore s(state_units(layout), ::testing::TempDir(), GetParam());
  ASSERT_TRUE(s.moments_on_disk());
  size_t largest = 0;
  for (int u = 0; u < s.n_units(); ++u) largest = std::max(largest, size_t(s.numel(u)) * 8);
  EXPECT_GE(disk_slot_bytes(state_units(layout)), ParamStore::kDiskSlots * largest);
  sweep_store(s, 0, 1, true);   // the optimizer's sweep
  sweep_store(s, 1, 2, false);  // a checkpoint's load, through the mapping
  sweep_store(s, 2, 3, true);
  s.flush_disk();
  sweep_store(s, 3, 4, false);
  sweep_store(s, 4, 5, true);
  sweep_store(s, 5, 5, false);  // a checkpoint's save
}

// Compact moments are opaque bytes to the tier: every byte of m and v of every unit survives
// sweeps through the slots and reads through the mapping.
class CompactStoreOnTier : public ::testing::TestWithParam<MomentFormat> {};

TEST_P(CompactStoreOnTier, EveryMomentByteRoundTrips) {
  const ModelLayout layout = ModelLayout::build(model_preset("tiny"));
  const StateFormat f{GetParam(), MasterFormat::bf16};
  ParamStore s(state_units(layout), f, ::testing::TempDir(), true);
  auto byte = [](int k, int u, int which, size_t i) { return uint8_t(k == 0 ? 0 : (i * 131 + size_t(u) * 7 + size_t(which) * 3 + size_t(k)) % 251); };
  for (int k = 0; k < 3; ++k)
    for (int u = 0; u < s.n_units(); ++u) {
      const bool slots = k != 1;  // the middle sweep through the mapping
      if (slots) {
        if (u == 0) s.prefetch_disk_unit(0);
        if (u + 1 < s.n_units()) s.prefetch_disk_unit(u + 1);
        s.acquire_disk_unit(u);
      }
      const UnitStateView v = s.state(u);
      for (int which = 0; which < 2; ++which) {
        auto* p = static_cast<uint8_t*>(which == 0 ? v.m : v.v);
        for (size_t i = 0; i < v.layout->moment_bytes; ++i) {
          ASSERT_EQ(p[i], byte(k, u, which, i)) << moment_format_name(f.moments) << " unit " << u << " byte " << i;
          p[i] = byte(k + 1, u, which, i);
        }
      }
      s.disk_unit_done(u);
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, CompactStoreOnTier, ::testing::Values(MomentFormat::bf16, MomentFormat::int8),
                         [](const auto& info) { return std::string(moment_format_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Modes, StoreOnTier, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "streamed" : "cached"); });

}  // namespace
}  // namespace sf
