#include "engine/schedule.h"

#include <set>

#include "core/error.h"

namespace sf {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::wait_update: return "wait_update";
    case OpKind::load_weights: return "load_weights";
    case OpKind::home_weights: return "home_weights";
    case OpKind::embed_forward: return "embed_forward";
    case OpKind::layer_forward: return "layer_forward";
    case OpKind::offload_input: return "offload_input";
    case OpKind::head: return "head";
    case OpKind::grads_out: return "grads_out";
    case OpKind::fetch_input: return "fetch_input";
    case OpKind::layer_backward: return "layer_backward";
    case OpKind::embed_backward: return "embed_backward";
    case OpKind::replay_forward: return "replay_forward";
    case OpKind::update: return "update";
  }
  return "?";
}

std::string describe(const Op& op) {
  std::string s(op_kind_name(op.kind));
  if (op.unit >= 0) s += cat(" unit=", op.unit);
  if (op.layer >= 0) s += cat(" layer=", op.layer);
  if (op.chunk >= 0) s += cat(" chunk=", op.chunk);
  if (op.slot >= 0 || op.kind == OpKind::load_weights) s += cat(" slot=", op.slot);
  if (op.buf >= 0) s += cat(" buf=", op.buf);
  if (op.act >= 0) s += cat(" act=", op.act);
  if (op.kind == OpKind::update) s += op.device ? " on the device" : " on the host";
  return s;
}

namespace {

bool flag(const std::vector<char>& v, int u) { return size_t(u) < v.size() && v[size_t(u)]; }

class Builder {
 public:
  explicit Builder(const StepShape& sh) : sh_(sh), slot_layer_(size_t(sh.n_slots), -1) {}

  std::vector<Op> build() {
    forward();
    for (int c = 0; c < sh_.n_chunks; ++c) ops_.push_back({OpKind::head, head_unit(), -1, c});
    if (!sh_.backward()) return std::move(ops_);
    ops_.push_back({OpKind::grads_out, head_unit()});
    backward();
    updates();
    return std::move(ops_);
  }

 private:
  int head_unit() const { return sh_.n_layers + 1; }
  int slot_of(int k) const { return k % sh_.n_slots; }
  OpKind weights_op(int u) const {
    return flag(sh_.weights_on_device, u) ? OpKind::home_weights : OpKind::load_weights;
  }
  void load_into(int k, int slot) {
    ops_.push_back({weights_op(k + 1), k + 1, k, -1, slot});
    slot_layer_[size_t(slot)] = k;
  }
  void load(int k) { load_into(k, slot_of(k)); }

  void forward() {
    const int L = sh_.n_layers, C = sh_.n_chunks;
    ops_.push_back({OpKind::wait_update, 1});
    load(0);
    ops_.push_back({OpKind::wait_update, 0});
    for (int c = 0; c < C; ++c) ops_.push_back({OpKind::embed_forward, 0, -1, c});
    for (int k = 0; k < L; ++k) {
      // Overlaps with layer k's compute.
      if (k + 1 < L) {
        ops_.push_back({OpKind::wait_update, k + 2});
        load(k + 1);
      } else {
        ops_.push_back({OpKind::wait_update, head_unit()});
        ops_.push_back({weights_op(head_unit()), head_unit()});
      }
      for (int c = 0; c < C; ++c) {
        // The input goes to the store while the layer computes on it (both only read it).
        if (sh_.backward() && sh_.saves_input(k)) ops_.push_back({OpKind::offload_input, k + 1, k, c});
        ops_.push_back({OpKind::layer_forward, k + 1, k, c, slot_of(k)});
      }
    }
  }

  // One layer visit of the backward, over every chunk: a replay or a layer's backward.
  // act: the activation buffer a replay writes, or an unsaved layer's backward reads.
  struct Visit {
    OpKind kind;
    int layer;
    int act;
    bool reads_saved() const { return act < 0 || (kind == OpKind::replay_forward && act == 0); }
  };

  // From the top, segments [a, top] of a saved layer a and the unsaved ones above it: the
  // replays a .. top-1 (each writing the next one's input), then the backwards top .. a.
  std::vector<Visit> backward_visits() const {
    std::vector<Visit> v;
    for (int top = sh_.n_layers - 1; top >= 0;) {
      int a = top;
      while (!sh_.saves_input(a)) --a;
      SF_CHECK(a >= 0 && top - a <= 2, "at most two layers in a row without a saved input");
      for (int j = a; j < top; ++j) v.push_back({OpKind::replay_forward, j, j - a});
      for (int j = top; j >= a; --j) v.push_back({OpKind::layer_backward, j, j > a ? j - 1 - a : -1});
      top = a - 1;
    }
    return v;
  }

  // The next visit at or after i that uses layer k's weights (visits.size(): none).
  static size_t next_use(const std::vector<Visit>& visits, size_t i, int k) {
    while (i < visits.size() && visits[i].layer != k) ++i;
    return i;
  }
  int slot_holding(int k) const {
    for (int s = 0; s < sh_.n_slots; ++s)
      if (slot_layer_[size_t(s)] == k) return s;
    return -1;
  }
  // A slot for layer k, first used at visit `use`, other than `busy`'s: one whose layer is
  // needed no more (k's own slot_of first, the forward's placement), else the one needed
  // last, if after `use` (a demand load, use == from, may take any); -1: none.
  int slot_for(const std::vector<Visit>& visits, size_t from, size_t use, int k, int busy) const {
    int best = -1;
    size_t best_use = 0;
    for (int s0 = 0; s0 < sh_.n_slots; ++s0) {
      const int s = (slot_of(k) + s0) % sh_.n_slots;
      if (s == busy) continue;
      const int held = slot_layer_[size_t(s)];
      const size_t u = held < 0 ? visits.size() : next_use(visits, from, held);
      if (u == visits.size()) return s;
      if (u > best_use) best = s, best_use = u;
    }
    return best_use > use ? best : -1;
  }
  // Before visit i: its layer's weights in a slot, and the next other layer's loading into
  // another one while it computes.
  void weights_for(const std::vector<Visit>& visits, size_t i) {
    const int k = visits[i].layer;
    if (slot_holding(k) < 0) {
      const int s = slot_for(visits, i + 1, i, k, -1);
      SF_CHECK(s >= 0, "no weight slot for layer ", k);  // every slot's next use is after i
      load_into(k, s);
    }
    size_t j = i + 1;
    while (j < visits.size() && visits[j].layer == k) ++j;
    if (j == visits.size() || slot_holding(visits[j].layer) >= 0) return;
    const int s = slot_for(visits, i + 1, j, visits[j].layer, slot_holding(k));
    if (s >= 0) load_into(visits[j].layer, s);
  }

  // Saved inputs are fetched one chunk ahead into two alternating buffers, in the order the
  // visits read them.
  void backward() {
    const int C = sh_.n_chunks;
    const std::vector<Visit> visits = backward_visits();
    std::vector<std::pair<int, int>> fetches;  // (layer, chunk)
    for (const Visit& v : visits)
      if (v.reads_saved())
        for (int c = 0; c < C; ++c) fetches.push_back({v.layer, c});
    size_t next_fetch = 0;
    auto fetch_next = [&] {
      if (next_fetch == fetches.size()) return;
      const auto [k, c] = fetches[next_fetch];
      ops_.push_back({OpKind::fetch_input, k + 1, k, c, -1, int(next_fetch % 2)});
      ++next_fetch;
    };
    fetch_next();
    for (size_t i = 0; i < visits.size(); ++i) {
      const Visit& v = visits[i];
      weights_for(visits, i);
      for (int c = 0; c < C; ++c) {
        int buf = -1;
        if (v.reads_saved()) {
          buf = int((next_fetch - 1) % 2);  // this one's fetch was the last issued
          fetch_next();
        }
        Op op{v.kind, v.layer + 1, v.layer, c, slot_holding(v.layer), buf};
        op.act = v.act;
        ops_.push_back(op);
      }
      if (v.kind == OpKind::layer_backward) ops_.push_back({OpKind::grads_out, v.layer + 1, v.layer});
    }
    for (int c = 0; c < C; ++c) ops_.push_back({OpKind::embed_backward, 0, -1, c});
  }

  // Device-AdamW layers first (each is only an enqueue: the GPU updates them while the CPU
  // takes the embedding), then forward order: embedding, layers, head (last: the round's end
  // is keyed on it). Landing: the backward's order.
  void updates() {
    if (sh_.updates_as_gradients_land) {
      for (int u = head_unit(); u >= 0; --u) ops_.push_back(update_op(u));
      return;
    }
    for (int u = 0; u <= head_unit(); ++u)
      if (flag(sh_.device_adamw, u)) ops_.push_back(update_op(u));
    for (int u = 0; u <= head_unit(); ++u)
      if (!flag(sh_.device_adamw, u)) ops_.push_back(update_op(u));
  }
  Op update_op(int u) const {
    Op op{OpKind::update, u};
    op.device = flag(sh_.device_adamw, u);
    return op;
  }

  const StepShape& sh_;
  std::vector<Op> ops_;
  std::vector<int> slot_layer_;  // which layer each slot holds
};

// The producer/consumer check of check_schedule, op by op in list order.
class Checker {
 public:
  explicit Checker(const StepShape& sh)
      : sh_(sh), slot_layer_(size_t(sh.n_slots), -1), buf_(2, {-1, -1}),
        waited_(size_t(sh.n_layers + 2), 0), updated_(size_t(sh.n_layers + 2), 0),
        grads_left_(size_t(sh.n_layers + 2), 0), bwd_chunks_(size_t(sh.n_layers), 0),
        replay_chunks_(size_t(sh.n_layers), 0) {}

  std::string run(const std::vector<Op>& ops) {
    for (const Op& op : ops) {
      const std::string e = check(op);
      if (!e.empty()) return describe(op) + ": " + e;
    }
    return finish();
  }

 private:
  using Key = std::pair<int, int>;  // (layer, chunk)
  int L() const { return sh_.n_layers; }
  int head_unit() const { return L() + 1; }
  bool in_units(int u) const { return u >= 0 && u <= head_unit(); }

  std::string check(const Op& op) {
    switch (op.kind) {
      case OpKind::wait_update:
        if (!in_units(op.unit)) return "no such unit";
        waited_[size_t(op.unit)] = 1;
        return {};
      case OpKind::load_weights:
      case OpKind::home_weights: return weights(op);
      case OpKind::embed_forward:
        if (!waited_[0]) return "the embedding's update was not waited for";
        out_.insert({-1, op.chunk});
        return {};
      case OpKind::offload_input:
        if (!sh_.saves_input(op.layer)) return "offloads the input of a layer that saves none";
        if (!out_.count({op.layer - 1, op.chunk})) return "its input was not produced";
        stored_.insert({op.layer, op.chunk});
        return {};
      case OpKind::layer_forward:
        if (!holds(op.slot, op.layer)) return "its slot does not hold its weights";
        if (!out_.count({op.layer - 1, op.chunk})) return "its input was not produced";
        if (sh_.backward() && sh_.saves_input(op.layer) && !stored_.count({op.layer, op.chunk}))
          return "its input was not offloaded first";
        out_.insert({op.layer, op.chunk});
        return {};
      case OpKind::head:
        if (!head_loaded_) return "the head's weights were not loaded";
        if (!out_.count({L() - 1, op.chunk})) return "its input was not produced";
        ++head_chunks_;
        return {};
      case OpKind::fetch_input:
        if (!stored_.count({op.layer, op.chunk})) return "fetches an input never offloaded";
        if (op.buf < 0 || op.buf > 1) return "no such input buffer";
        if (buf_[size_t(op.buf)].first >= 0) return "overwrites an input the backward has not read";
        buf_[size_t(op.buf)] = {op.layer, op.chunk};
        return {};
      case OpKind::layer_backward: return backward(op);
      case OpKind::replay_forward: return replay(op);
      case OpKind::grads_out: return grads_out(op);
      case OpKind::embed_backward:
        if (bwd_chunks_[0] != sh_.n_chunks) return "layer 0's backward is not complete";
        ++emb_chunks_;
        return {};
      case OpKind::update: return update(op);
    }
    return "unknown op";
  }

  bool holds(int slot, int layer) const {
    return slot >= 0 && slot < sh_.n_slots && slot_layer_[size_t(slot)] == layer;
  }

  std::string weights(const Op& op) {
    if (!in_units(op.unit)) return "no such unit";
    if (!waited_[size_t(op.unit)]) return "its update of the previous step was not waited for";
    const bool home = flag(sh_.weights_on_device, op.unit);
    if (home != (op.kind == OpKind::home_weights)) return "loads a unit whose weights are home, or the reverse";
    if (op.unit == head_unit()) {
      head_loaded_ = true;
      return {};
    }
    if (op.slot < 0 || op.slot >= sh_.n_slots) return "no such slot";
    // The slot's layer must be done with: every chunk of its pass that has started.
    const int old = slot_layer_[size_t(op.slot)];
    if (old >= 0 && pending_in_slot(old)) return cat("overwrites layer ", old, " before its pass ended");
    slot_layer_[size_t(op.slot)] = op.layer;
    return {};
  }
  bool pending_in_slot(int layer) const {
    int fwd = 0;
    for (const Key& k : out_)
      if (k.first == layer) ++fwd;
    const bool fwd_open = fwd > 0 && fwd < sh_.n_chunks;
    const bool bwd_open = bwd_chunks_[size_t(layer)] > 0 && bwd_chunks_[size_t(layer)] < sh_.n_chunks;
    const bool replay_open = replay_chunks_[size_t(layer)] > 0 && replay_chunks_[size_t(layer)] < sh_.n_chunks;
    return fwd_open || bwd_open || replay_open;
  }

  // The op's saved input in its fetch buffer (then consumed): "" when there, else what is wrong.
  std::string saved_in_buffer(const Op& op) {
    if (op.buf < 0 || op.buf > 1 || buf_[size_t(op.buf)] != Key{op.layer, op.chunk})
      return "its saved input is not in its buffer";
    buf_[size_t(op.buf)] = {-1, -1};
    return {};
  }
  bool replayed_in(int act, int layer, int chunk) const {
    return act >= 0 && act < 2 && act_[size_t(act)].first == layer && act_[size_t(act)].second.count(chunk);
  }

  std::string backward(const Op& op) {
    if (!holds(op.slot, op.layer)) return "its slot does not hold its weights";
    if (sh_.saves_input(op.layer)) {
      if (std::string e = saved_in_buffer(op); !e.empty()) return e;
    } else if (op.buf >= 0 || !replayed_in(op.act, op.layer - 1, op.chunk)) {
      return "its input (not saved) was not replayed into its activation buffer";
    }
    if (op.layer + 1 < L() && bwd_chunks_[size_t(op.layer + 1)] != sh_.n_chunks)
      return "the layer above has not finished its backward";
    if (op.layer + 1 == L() && head_chunks_ != sh_.n_chunks) return "the head has not run every chunk";
    ++bwd_chunks_[size_t(op.layer)];
    return {};
  }

  // A replay writes the input of the unsaved layer above, before that layer's backward, into a
  // buffer whose last replayed inputs' backward is done.
  std::string replay(const Op& op) {
    const int k = op.layer;
    if (!holds(op.slot, k)) return "its slot does not hold its weights";
    if (k + 1 >= L() || sh_.saves_input(k + 1)) return "replays the input of a layer that saved its own";
    if (head_chunks_ != sh_.n_chunks) return "replays before the backward began";
    if (bwd_chunks_[size_t(k + 1)] > 0) return "replays after the backward of the layer above began";
    if (op.act < 0 || op.act > 1) return "no such activation buffer";
    if (op.buf >= 0) {
      if (!sh_.saves_input(k)) return "reads a saved input of a layer that saves none";
      if (std::string e = saved_in_buffer(op); !e.empty()) return e;
    } else if (!replayed_in(op.act - 1, k - 1, op.chunk)) {
      return "its input was not replayed";
    }
    auto& [held, chunks] = act_[size_t(op.act)];
    if (held != k && held >= 0) {
      if (bwd_chunks_[size_t(held + 1)] != sh_.n_chunks) return "overwrites a replayed input the backward has not read";
      chunks.clear();
    }
    held = k;
    chunks.insert(op.chunk);
    ++replay_chunks_[size_t(k)];
    return {};
  }

  std::string grads_out(const Op& op) {
    if (!in_units(op.unit) || op.unit == 0) return "no such unit";
    const bool done = op.unit == head_unit() ? head_chunks_ == sh_.n_chunks
                                             : bwd_chunks_[size_t(op.unit - 1)] == sh_.n_chunks;
    if (!done) return "its gradient is not complete";
    if (grads_left_[size_t(op.unit)]++) return "sends its gradient twice";
    return {};
  }

  std::string update(const Op& op) {
    if (!in_units(op.unit)) return "no such unit";
    if (updated_[size_t(op.unit)]++) return "updated twice";
    if (op.device != flag(sh_.device_adamw, op.unit)) return "updated on the wrong side";
    if (op.unit == 0 ? emb_chunks_ != sh_.n_chunks : !grads_left_[size_t(op.unit)])
      return "its gradient has not left";
    return {};
  }

  std::string finish() const {
    for (int u = 0; u <= head_unit(); ++u) {
      if (!waited_[size_t(u)]) return cat("unit ", u, ": its update was never waited for");
      if (sh_.backward() && !updated_[size_t(u)]) return cat("unit ", u, ": never updated");
    }
    if (head_chunks_ != sh_.n_chunks) return "the head did not run every chunk";
    return {};
  }

  const StepShape& sh_;
  std::vector<int> slot_layer_;
  std::vector<Key> buf_;
  std::set<Key> out_, stored_;  // outputs produced ({-1, c}: the embedding's), inputs stored
  std::vector<char> waited_, updated_, grads_left_;
  std::vector<int> bwd_chunks_, replay_chunks_;
  // Per activation buffer: the layer whose replayed outputs it holds, and for which chunks.
  std::pair<int, std::set<int>> act_[2] = {{-1, {}}, {-1, {}}};
  bool head_loaded_ = false;
  int head_chunks_ = 0, emb_chunks_ = 0;
};

}  // namespace

std::vector<Op> build_step_schedule(const StepShape& sh) {
  SF_CHECK(sh.n_layers >= 1 && sh.n_chunks >= 1 && sh.n_slots >= 2, "bad step shape");
  return Builder(sh).build();
}

std::string check_schedule(const StepShape& sh, const std::vector<Op>& ops) {
  return Checker(sh).run(ops);
}

}  // namespace sf
