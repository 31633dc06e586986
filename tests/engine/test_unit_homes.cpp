// UnitHomes: what each home holds is explicit, and a transition from the wrong state is an
// internal error naming the unit and both states (the executor's ordering bugs surface there
// instead of as wrong weights); refresh() makes every home hold weights again. Data parallel
// on the GPU path: the ranks' streamed homes are one copy in a region they share, and each
// rank's refresh writes only its slice of it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/host/host_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/data_parallel.h"
#include "engine/unit_homes.h"
#include "model/model_init.h"

using namespace sf;

namespace {

EngineConfig small_window(int world = 1) {
  EngineConfig ec;
  ec.max_chunk_tokens = 16;
  ec.resident_layers = 1;
  ec.head_resident = true;
  ec.data_parallel_world = world;
  return ec;
}

// One rank's window context. cd: the compute dtype its homes hold (bf16: the GPU path's
// homes, here in host memory); shared: the ranks' region for their streamed homes.
struct Window {
  HostBackend be;
  ModelConfig cfg = tiny_config(Arch::llama);
  ModelLayout layout = ModelLayout::build(cfg);
  EngineConfig ec;
  ParamStore& store;
  std::unique_ptr<WindowBuffers> bufs;
  std::unique_ptr<WindowStreams> streams;
  std::unique_ptr<WindowEvents> ev;
  std::unique_ptr<WindowContext> w;
  explicit Window(ParamStore& st, EngineConfig e = small_window(), DType cd = DType::f32, SharedHomeMemory shared = {})
      : ec(e), store(st) {
    bufs = std::make_unique<WindowBuffers>(be, window_buffer_specs(cfg, ec, cd), shared);
    streams = std::make_unique<WindowStreams>(be);
    ev = std::make_unique<WindowEvents>(be, ec.n_slots, ec.max_chunks, int(layout.units.size()));
    w = std::make_unique<WindowContext>(WindowContext{be, cfg, layout, ec, {}, cd, store, *bufs, *ev, *streams,
                                                      ec.max_chunk_tokens});
  }
};

ParamStore make_store() { return ParamStore(state_units(ModelLayout::build(tiny_config(Arch::llama)))); }

TEST(UnitHomes, TransitionsAreChecked) {
  ParamStore store = make_store();
  Window win(store);
  UnitHomes homes(*win.w);
  const int L = win.layout.n_layers, head = L + 1;
  EXPECT_TRUE(homes.resident(L));      // the last layer
  EXPECT_TRUE(homes.resident(head));
  EXPECT_FALSE(homes.resident(1));
  for (int u = 1; u <= head; ++u) EXPECT_EQ(homes.state(u), HomeState::weights);
  homes.set(2, HomeState::weights, HomeState::gradient, "grads_out");
  EXPECT_EQ(homes.state(2), HomeState::gradient);
  // The forward may not load a gradient, and the update may not start twice.
  EXPECT_THROW(homes.expect(2, HomeState::weights, "wait_update"), Error);
  homes.set(2, HomeState::gradient, HomeState::updating, "update");
  try {
    homes.set(2, HomeState::gradient, HomeState::updating, "update");
    FAIL() << "a second update of unit 2 was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unit 2"), std::string::npos) << m;
    EXPECT_NE(m.find("an update in progress"), std::string::npos) << m;
  }
  // A skipped step puts the unchanged weights back in every home.
  homes.set(3, HomeState::weights, HomeState::gradient, "grads_out");
  homes.refresh(UnitHomes::DeviceAdamWHomes::keep);
  for (int u = 1; u <= head; ++u) EXPECT_EQ(homes.state(u), HomeState::weights) << "unit " << u;
}

// Two ranks of the GPU path (bf16 homes, data_parallel_world 2): the streamed homes of both
// are the same memory, placed page-apart in the ranks' region in the buffer list's order; the
// resident ones are each rank's own. A refresh writes this rank's slice of a shared home (the
// other rank's slice keeps its bytes until that rank refreshes); a region too small is refused.
TEST(UnitHomes, RanksShareTheStreamedHomesAndEachRefreshesItsSlice) {
  ParamStore store = make_store();
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.f, 0.02f);
  for (int u = 0; u < store.n_units(); ++u)
    for (int64_t i = 0; i < store.numel(u); ++i) store.master(u)[i] = d(g);
  const EngineConfig ec = small_window(2);
  const ModelConfig cfg = tiny_config(Arch::llama);
  const std::vector<BufferSpec> specs = window_buffer_specs(cfg, ec, DType::bf16);
  const size_t bytes = shared_bytes(specs);
  ASSERT_GT(bytes, 0u);
  EXPECT_EQ(shared_bytes(window_buffer_specs(cfg, ec, DType::f32)), 0u) << "f32 homes hold a rank's own gradient";
  EXPECT_EQ(shared_bytes(window_buffer_specs(cfg, small_window(1), DType::bf16)), 0u) << "one rank shares nothing";
  HostArray region(bytes, "test shared homes");
  std::memset(region.data(), 0xEE, bytes);
  Window r0(store, ec, DType::bf16, {region.data(), bytes}), r1(store, ec, DType::bf16, {region.data(), bytes});
  UnitHomes h0(*r0.w), h1(*r1.w);
  h0.share_with_ranks(0, 2);
  h1.share_with_ranks(1, 2);
  const int L = r0.layout.n_layers, head = L + 1;
  size_t at = 0;
  for (int u = 1; u < L; ++u) {  // the streamed layers, in the list's order
    EXPECT_TRUE(h0.shared(u) && h1.shared(u)) << "unit " << u;
    EXPECT_EQ(h0.home(u)->data(), region.as<char>() + at) << "unit " << u;
    EXPECT_EQ(h1.home(u)->data(), h0.home(u)->data()) << "unit " << u;
    at += (size_t(store.numel(u)) * 2 + 65535) / 65536 * 65536;
  }
  EXPECT_EQ(at, bytes);
  for (int u : {L, head}) {
    EXPECT_FALSE(h0.shared(u)) << "resident unit " << u;
    EXPECT_NE(h0.home(u)->data(), h1.home(u)->data()) << "resident unit " << u;
  }
  auto matches = [&](int u, int64_t b, int64_t e) {  // home elements [b, e) are the master's bf16
    const auto* home = static_cast<const uint16_t*>(h0.home(u)->data());
    for (int64_t i = b; i < e; ++i)
      if (home[i] != f32_to_bf16(store.master(u)[i])) return false;
    return true;
  };
  h0.refresh(UnitHomes::DeviceAdamWHomes::keep);
  for (int u = 1; u < L; ++u) {
    const int64_t n = store.numel(u);
    const dist::ShardRange s0 = dist::shard_range(size_t(n), 2, 0, kSliceAlign);
    EXPECT_TRUE(matches(u, 0, int64_t(s0.end))) << "rank 0's slice of unit " << u;
    const auto* home = static_cast<const uint16_t*>(h0.home(u)->data());
    EXPECT_EQ(home[s0.end], 0xEEEE) << "rank 1's slice of unit " << u << " is rank 1's to write";
  }
  h1.refresh(UnitHomes::DeviceAdamWHomes::keep);
  for (int u = 1; u < L; ++u) EXPECT_TRUE(matches(u, 0, store.numel(u))) << "unit " << u << " whole";

  HostArray small(bytes - 65536, "too small");
  EXPECT_THROW({ Window w(store, ec, DType::bf16, {small.data(), small.bytes()}); }, Error);
}

}  // namespace
