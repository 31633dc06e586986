// The sliding window's events: one per purpose and slot / chunk / buffer / unit. The
// streams (compute, h2d, d2h, grads, and the update thread's two) are ordered by these alone;
// each comment says what a recorded event means. Created once, before the first step.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace sf {

struct WindowEvents {
  std::vector<std::unique_ptr<Event>> slot_ready, slot_free;  // per weight slot
  std::vector<std::unique_ptr<Event>> emb_done, out_ready;    // per chunk
  // Per (layer parity, chunk): the store has copied the input of the layer of that parity
  // out of its X buffer, which the next layer may now overwrite. [parity * n_chunks + c]
  std::vector<std::unique_ptr<Event>> off_done;
  std::unique_ptr<Event> buf_ready[2], buf_free[2];           // per backward input buffer
  std::unique_ptr<Event> grads_done[2], grads_copied[2];      // per layer-gradient buffer
  std::unique_ptr<Event> grads_cast[2], head_cast;  // grads_out's casts done (grads stream)
  std::unique_ptr<Event> head_ready, head_done, offloads_done, layer0_done, emb_rows_done,
      batch_ready, head_grads_home;
  std::vector<std::unique_ptr<Event>> home_ready;  // per unit: new weights are home
  std::vector<std::unique_ptr<Event>> grads_home;  // per unit: its gradient is home
  std::unique_ptr<Event> ring_down[2];             // a gradient piece has landed in the ring
  std::unique_ptr<Event> ring_up[2];               // the ring's new weights have left for the device
  std::unique_ptr<Event> stage_free[2];            // gstage buffer copied out
  WindowEvents(Backend& be, int n_slots, int n_chunks, int n_units) {
    auto make = [&](int n) {
      std::vector<std::unique_ptr<Event>> v;
      for (int i = 0; i < n; ++i) v.push_back(be.create_event());
      return v;
    };
    slot_ready = make(n_slots);
    slot_free = make(n_slots);
    emb_done = make(n_chunks);
    out_ready = make(n_chunks);
    off_done = make(2 * n_chunks);
    for (int i = 0; i < 2; ++i) {
      buf_ready[i] = be.create_event();
      buf_free[i] = be.create_event();
      grads_done[i] = be.create_event();
      grads_copied[i] = be.create_event();
      grads_cast[i] = be.create_event();
    }
    head_cast = be.create_event();
    head_ready = be.create_event();
    head_done = be.create_event();
    offloads_done = be.create_event();
    layer0_done = be.create_event();
    emb_rows_done = be.create_event();
    batch_ready = be.create_event();
    head_grads_home = be.create_event();
    home_ready = make(n_units);
    grads_home = make(n_units);
    for (int i = 0; i < 2; ++i) {
      ring_down[i] = be.create_event();
      ring_up[i] = be.create_event();
      stage_free[i] = be.create_event();
    }
  }
};

}  // namespace sf
