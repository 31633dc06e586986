// UnitHomes: what each home holds is explicit, and a transition from the wrong state is an
// internal error naming the unit and both states (the executor's ordering bugs surface there
// instead of as wrong weights); refresh() makes every home hold weights again.
#include <gtest/gtest.h>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "engine/unit_homes.h"
#include "model/model_init.h"

using namespace sf;

namespace {

struct Window {
  HostBackend be;
  ModelConfig cfg = tiny_config(Arch::llama);
  ModelLayout layout = ModelLayout::build(cfg);
  EngineConfig ec;
  ParamStore store{state_units(layout)};
  std::unique_ptr<WindowBuffers> bufs;
  std::unique_ptr<WindowStreams> streams;
  std::unique_ptr<WindowEvents> ev;
  std::unique_ptr<WindowContext> w;
  Window() {
    ec.max_chunk_tokens = 16;
    ec.resident_layers = 1;
    ec.head_resident = true;
    bufs = std::make_unique<WindowBuffers>(be, window_buffer_specs(cfg, ec, be.compute_dtype()));
    streams = std::make_unique<WindowStreams>(be);
    ev = std::make_unique<WindowEvents>(be, ec.n_slots, ec.max_chunks, int(layout.units.size()));
    w = std::make_unique<WindowContext>(WindowContext{be, cfg, layout, ec, {}, be.compute_dtype(), store, *bufs,
                                                      *ev, *streams, ec.max_chunk_tokens});
  }
};

TEST(UnitHomes, TransitionsAreChecked) {
  Window win;
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

}  // namespace
