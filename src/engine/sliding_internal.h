// Private to the sliding-window executor's translation units (sliding_executor.cpp,
// sliding_update.cpp, sliding_speculation.cpp): its events and the speculative update's
// shared state.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/sliding_executor.h"

namespace sf {

struct SlidingWindowExecutor::Events {
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
  // Around every compute op (layer forward/backward, head): the GPU-busy share of a step.
  // Empty where the backend cannot time events.
  std::vector<std::unique_ptr<Event>> busy_start, busy_end;
  std::unique_ptr<Event> step_end;  // after the last compute op of the previous training step

  Events(Backend& be, int n_slots, int n_chunks, int n_units) {
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
    const int n_layers = n_units - 2;
    for (int i = 0; i < (2 * n_layers + 1) * n_chunks; ++i) {
      auto a = be.create_timing_event(), b = be.create_timing_event();
      if (!a || !b) break;
      busy_start.push_back(std::move(a));
      busy_end.push_back(std::move(b));
    }
    if (!busy_start.empty()) step_end = be.create_timing_event();
  }
};

struct SlidingWindowExecutor::Spec {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> ready;       // gradient of the unit is (being) copied home
  std::vector<char> speculated;  // AdamW already applied with coefficient 1
  std::vector<double> sumsq;     // per unit, in double on the host
  double busy_seconds = 0;       // phase A's time in AdamW (and norms) this step
  std::thread thread;
  std::exception_ptr error;
  AdamWStep step;                // the speculated step (grad_scale 1)
  std::vector<char> have_sq;     // sumsq[u] is known
  bool active = false;
  bool stop = false;             // abandon the loop (a step that threw, or destruction)
  std::atomic<bool> closing{false};  // the backward is over: take no new unit
  // The backward is over: phase A takes no new unit. The flag is set under the mutex: set
  // without it, the loop could test its wait predicate (closing still false), miss this
  // notify, and sleep forever (run() then hangs in finish_speculative's join; seen once in
  // CI as a test that never ended).
  void close() {
    {
      std::lock_guard<std::mutex> lk(mu);
      closing = true;
    }
    cv.notify_all();
  }
  // Stops and joins a loop that is still running because its step threw. Units it already
  // updated keep that update: a step that throws ends training (the trainer stops on the
  // error), and a resume starts from the last checkpoint.
  void abandon() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
    stop = false;
    active = false;
  }
};

}  // namespace sf
