#include "engine/window_buffers.h"

#include <algorithm>

#include "core/error.h"
#include "engine/device_state.h"
#include "engine/embedding_grad.h"  // EmbeddingGrad::max_rows
#include "model/device_batch.h"
#include "model/param_layout.h"
#include "model/recipes.h"

namespace sf {

namespace {

// A shared home's spacing in its region: a multiple of the page (4 KiB, 64 KiB on some ARM
// kernels), so that no two share a page CUDA registers.
constexpr size_t kSharedPage = 64 << 10;
constexpr const char* kSharedHomesLine = "weights/gradient homes (streamed, one copy the ranks share)";

// Builds the list in the executor's allocation order.
class SpecList {
 public:
  SpecList(const ModelConfig& cfg, const EngineConfig& ec, DType cd)
      : cfg_(cfg), ec_(ec), l_(ModelLayout::build(cfg)), cd_(cd), es_(dtype_size(cd)) {
    n_units_ = int(l_.units.size());
    for (int k = 0; k < l_.n_layers; ++k) max_layer_ = std::max(max_layer_, l_.layer(k).numel);
    Tc_ = ec.max_chunk_tokens;
    Tstep_ = Tc_ * ec.max_chunks;
    xbytes_ = size_t(Tstep_) * size_t(cfg.hidden_size) * es_;
    for (int u = 1; u < n_units_; ++u)
      if (resident(u)) max_home_ = std::max(max_home_, numel(u));
  }

  std::vector<BufferSpec> build() {
    device_adamw();
    master_mirrors();
    homes();
    embedding();
    update_buffers();
    window();
    return std::move(specs_);
  }

 private:
  bool resident(int u) const {
    if (u == n_units_ - 1) return ec_.head_resident;
    return ec_.device_adamw(u) || (u >= 1 && u - 1 >= l_.n_layers - ec_.resident_layers);
  }
  int64_t numel(int u) const { return l_.units[size_t(u)].numel; }
  // Several ranks' GPU path: a streamed home holds weights every rank reads and a gradient
  // each rank writes only its slice of (its shard of the device-reduced sum), so one copy
  // serves them all. (With an fp32 compute dtype a home holds a rank's own unreduced gradient.)
  bool shared_homes() const { return ec_.data_parallel_world > 1 && cd_ != DType::f32 && !ec_.from_master(); }
  void add(BufferRole r, int index, Tier t, size_t bytes, std::string what, std::string line) {
    specs_.push_back({r, index, t, bytes, std::move(what), std::move(line)});
  }

  void device_adamw() {
    const int D = ec_.device_adamw_layers;
    const std::string line = D == 1 ? std::string("layer 0 master + AdamW m, v (its AdamW on the device)")
                                    : cat("layers 0-", D - 1, " master + AdamW m, v (their AdamW on the device)");
    const std::vector<StateUnit> units = D > 0 ? state_units(l_) : std::vector<StateUnit>{};
    for (int k = 0; k < D; ++k) {
      const size_t n = size_t(l_.layer(k).numel);
      const size_t state = ec_.state_format.is_fp32()
                               ? n * 12
                               : device_state_parts(unit_state_layout(units[size_t(k + 1)], ec_.state_format)).bytes;
      add(BufferRole::device_adamw_state, k, Tier::device, state, cat("layer ", k, " master, AdamW m and v"), line);
      if (k >= 2)
        add(BufferRole::device_adamw_grad, k, Tier::device, n * 4, cat("layer ", k, " gradient accumulator"),
            cat("gradient accumulators of layers 2-", D - 1));
    }
  }

  // An f32 compute dtype reads its weights from the master itself; a bf16 master has to be
  // decoded for it first (the host backend: tests and CPU-only runs).
  void master_mirrors() {
    if (cd_ != DType::f32 || !ec_.bf16_master()) return;
    for (int u = 0; u < n_units_; ++u)
      add(BufferRole::master_mirror, u, Tier::host, size_t(numel(u)) * 4, cat("f32 weights of unit ", u),
          "f32 weights decoded from the bf16 master");
  }

  // [0] holds the tied table's compute-dtype weights when the head needs them.
  void homes() {
    int dev_layers = 0;
    for (int u = 1; u + 1 < n_units_; ++u) dev_layers += resident(u);
    const std::string dev_line = cat("weights/gradient homes (", dev_layers, " layers",
                                     ec_.head_resident ? " + head" : "", ")");
    for (int u = 0; u < n_units_; ++u) {
      const size_t bytes = size_t(numel(u)) * es_;
      if (u == 0) {
        if (l_.tied && cd_ != DType::f32)
          add(BufferRole::home, 0, Tier::host, bytes, "tied table staging", "tied table staging + gradient");
        continue;
      }
      if (resident(u)) add(BufferRole::home, u, Tier::device, bytes, cat("home of unit ", u), dev_line);
      else if (shared_homes()) add(BufferRole::home, u, Tier::host_shared, bytes, cat("home of unit ", u), kSharedHomesLine);
      else if (!ec_.from_master()) add(BufferRole::home, u, Tier::host, bytes, cat("home of unit ", u), "weights/gradient homes (streamed)");
    }
  }

  void embedding() {
    const int64_t V = cfg_.vocab_size, C = cfg_.hidden_size;
    const int64_t rows = EmbeddingGrad::max_rows(V, Tstep_, l_.tied);
    add(BufferRole::embedding_grad, 0, Tier::host, size_t(rows * C) * 4, "embedding gradient",
        l_.tied ? "embedding gradient (f32)" : "embedding gradient (f32, the step's rows)");
    if (l_.tied) {
      add(BufferRole::tied_table_grad_host, 0, Tier::host, size_t(V * C) * 4, "tied table gradient",
          "tied table staging + gradient");
      add(BufferRole::embedding_grad_stage, 0, Tier::host, xbytes_, "embedding gradient staging",
          "embedding gradient staging");
    } else {
      const size_t rows_bytes = size_t(2 * Tstep_) * 4;
      add(BufferRole::embedding_rows_device, 0, Tier::device, rows_bytes, "embedding rows of the tokens",
          "batch inputs, loss, norms");
      add(BufferRole::embedding_rows_host, 0, Tier::host, rows_bytes, "embedding rows of the tokens",
          "embedding rows of the tokens");
    }
  }

  void update_buffers() {
    SF_REQUIRE(ec_.ring_piece > 0, "sliding window: ring_piece must be positive");
    const size_t ring = size_t(std::min(max_home_, ec_.ring_piece)) * es_;
    for (int i = 0; i < 2; ++i) {
      if (max_home_ > 0) add(BufferRole::update_ring, i, Tier::host, ring, cat("update ring ", i), "update ring (2)");
      if (cd_ != DType::f32)
        add(BufferRole::grad_cast, i, Tier::device, size_t(max_layer_) * es_, cat("gradient cast ", i),
            "layer gradient accumulators + casts");
    }
    if (ec_.from_master()) master_buffers();
    add(BufferRole::norms, 0, Tier::device, size_t(n_units_) * 4, "resident gradient norms",
        "batch inputs, loss, norms");
    if (!ec_.speculative() || cd_ == DType::f32) return;
    int n_next = 0;
    for (int u = 0; u < n_units_; ++u) n_next += ec_.has_next(u, n_units_);
    for (int u = 0; u < n_units_; ++u)
      if (ec_.has_next(u, n_units_))
        add(BufferRole::next_weights, u, Tier::host, size_t(numel(u)) * es_, cat("next weights of unit ", u),
            cat("next weights (speculative update, ", n_next, " units)"));
  }

  // The gradient ring holds whole layers (the update reads one while the next lands); the
  // stage, pieces of a layer's fp32 master (one at a time: the copy and its cast share h2d).
  void master_buffers() {
    SF_REQUIRE(!ec_.speculative() && ec_.device_adamw_layers == 0,
               "sliding window: weights from the master exclude speculation and device AdamW");
    int64_t largest = 0;  // of the streamed units: the layers, and the head unless resident
    for (int u = 1; u < n_units_; ++u) {
      SF_REQUIRE(u + 1 == n_units_ || !resident(u), "sliding window: weights from the master keep no layer resident");
      if (!resident(u)) largest = std::max(largest, numel(u));
    }
    for (int i = 0; i < 2; ++i)
      add(BufferRole::grad_ring, i, Tier::host, size_t(largest) * es_, cat("gradient ring ", i),
          "gradient ring (2 layers)");
    if (cd_ != DType::f32 && !ec_.bf16_master())  // a bf16 master is copied as it is
      add(BufferRole::master_stage, 0, Tier::device, size_t(std::min(max_layer_, ec_.ring_piece)) * 4,
          "fp32 master stage", "fp32 master stage (cast on the device)");
  }

  void window() {
    const int64_t V = cfg_.vocab_size, C = cfg_.hidden_size;
    const size_t layer_bytes = size_t(max_layer_) * es_;
    for (int s = 0; s < ec_.n_slots; ++s)
      add(BufferRole::weight_slot, s, Tier::device, layer_bytes, cat("weight slot ", s),
          cat("weight slots (", ec_.n_slots, ")"));
    const size_t head = size_t(l_.head().numel);
    const std::string head_line = "head weights / gradient accumulator";
    if (!resident(n_units_ - 1) || cd_ == DType::f32)
      add(BufferRole::head_weights, 0, Tier::device, head * es_, "head weights", head_line);
    add(BufferRole::head_grad, 0, Tier::device, size_t(padded_for_ranks(int64_t(head), ec_.data_parallel_world)) * 4,
        "head gradients", head_line);
    if (l_.tied) {
      add(BufferRole::tied_table, 0, Tier::device, size_t(V * C) * es_, "tied embedding table", "tied table + its gradient");
      add(BufferRole::tied_table_grad, 0, Tier::device, size_t(V * C) * 4, "tied embedding table gradient",
          "tied table + its gradient");
    }
    const std::string x_line = "step activations + gradient [T, C] x3";
    SF_REQUIRE(ec_.layer_grad_buffers == 2 || (ec_.layer_grad_buffers == 1 && ec_.device_adamw_layers == 0),
               "sliding window: 1 or 2 layer gradient buffers (1 only without device-AdamW layers)");
    for (int i = 0; i < ec_.layer_grad_buffers; ++i)
      add(BufferRole::layer_grad, i, Tier::device, size_t(padded_for_ranks(max_layer_, ec_.data_parallel_world)) * 4,
          cat("layer gradient buffer ", i),
          "layer gradient accumulators + casts");
    for (int i = 0; i < 2; ++i) {
      add(BufferRole::activations, i, Tier::device, xbytes_, cat("layer activations ", i), x_line);
      add(BufferRole::saved_input, i, Tier::device, size_t(Tc_ * C) * es_, cat("saved-input buffer ", i),
          "saved-input buffers (2)");
    }
    add(BufferRole::activation_grad, 0, Tier::device, xbytes_, "activation gradient", x_line);
    const int64_t rows = std::min(ec_.head_chunk_rows, Tc_);
    add(BufferRole::scratch, 0, Tier::device,
        std::max(layer_acts_bytes(cfg_, Tc_, cd_, ec_.mlp_tile_tokens), head_acts_bytes(cfg_, Tc_, cd_, rows)),
        "layer and head scratch", "layer/head scratch");
    add(BufferRole::loss, 0, Tier::device, 4, "loss", "batch inputs, loss, norms");
    SF_REQUIRE(ec_.checkpoint_every >= 1 && ec_.checkpoint_every <= 3, "sliding window: checkpoint_every ",
               ec_.checkpoint_every, " must be 1, 2 or 3 (the backward replays into two activation buffers)");
    SF_REQUIRE(ec_.strided_from >= 0, "sliding window: strided_from ", ec_.strided_from, " must be >= 0");
    int stored[2] = {0, 0};  // [on the device]: the saved layers per tier
    for (int k = 0; k < l_.n_layers; ++k)
      if (ec_.saves_input(k)) ++stored[ec_.act_on_device(k)];
    for (int k = 0; k < l_.n_layers; ++k) {
      if (!ec_.saves_input(k)) continue;
      const bool dev = ec_.act_on_device(k);
      add(BufferRole::act_store, k, dev ? Tier::device : Tier::host, xbytes_, cat("saved inputs of layer ", k),
          cat("activation store (", stored[dev], " layers)"));
    }
    kept_attention();
    for (int c = 0; c < ec_.max_chunks; ++c)
      add(BufferRole::batch_inputs, c, Tier::device, DeviceBatch::storage_bytes(cfg_, Tc_), "batch inputs",
          "batch inputs, loss, norms");
  }

  // The attention store of the first kept_attention_layers layers; on the host, two device
  // stages of one chunk each (the forward writes one while the other goes out; the backward
  // fetches into the one its saved-input buffer pairs with).
  void kept_attention() {
    const int n = ec_.kept_attention_layers;
    SF_REQUIRE(n >= 0 && n <= l_.n_layers, "sliding window: kept_attention_layers ", n,
               " must be in [0, ", l_.n_layers, "] (the model's layers)");
    if (n == 0) return;
    const bool dev = ec_.kept_attention_on_device;
    const size_t bytes = kept_attention_layout(cfg_, Tc_, ec_.max_chunks, cd_).bytes;
    const std::string line = cat("attention store (", n, " layers", dev ? ")" : ", pinned)");
    for (int k = 0; k < n; ++k)
      add(BufferRole::kept_attention, k, dev ? Tier::device : Tier::host, bytes, cat("kept attention of layer ", k),
          line);
    if (dev) return;
    for (int i = 0; i < 2; ++i)
      add(BufferRole::kept_attention_stage, i, Tier::device, kept_attention_layout(cfg_, Tc_, 1, cd_).bytes,
          cat("kept attention stage ", i), "attention store stages (2 chunks)");
  }

  const ModelConfig& cfg_;
  const EngineConfig& ec_;
  ModelLayout l_;
  DType cd_;
  size_t es_;
  int n_units_ = 0;
  int64_t max_layer_ = 0, max_home_ = 0, Tc_ = 0, Tstep_ = 0;
  size_t xbytes_ = 0;
  std::vector<BufferSpec> specs_;
};

}  // namespace

std::vector<BufferSpec> window_buffer_specs(const ModelConfig& cfg, const EngineConfig& ec, DType cd) {
  SF_REQUIRE(ec.max_chunk_tokens > 0 && ec.max_chunks >= 1, "sliding window: empty chunks");
  return SpecList(cfg, ec, cd).build();
}

KeptAttentionLayout kept_attention_layout(const ModelConfig& cfg, int64_t T, int chunks, DType cd) {
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t att = size_t(chunks) * size_t(T) * size_t(cfg.q_dim()) * dtype_size(cd);
  KeptAttentionLayout l;
  l.lse_offset = round(att);
  l.lse_stride = round(size_t(cfg.num_attention_heads) * size_t(T) * 4);
  l.bytes = l.lse_offset + size_t(chunks) * l.lse_stride;
  return l;
}

size_t tier_bytes(const BufferSpec& s) {
  const size_t g = s.tier == Tier::device ? 256 : s.tier == Tier::host_shared ? kSharedPage : 64;
  return (std::max<size_t>(s.bytes, 1) + g - 1) / g * g;
}

size_t shared_bytes(const std::vector<BufferSpec>& specs) {
  size_t n = 0;
  for (const BufferSpec& s : specs)
    if (s.tier == Tier::host_shared) n += tier_bytes(s);
  return n;
}

namespace {
// A buffer in memory the run owns (a shared region), pinned for DMA while it lives. data() is
// the host address: the CPU AdamW works in it as the copies do.
class PlacedHostBuffer final : public Buffer {
 public:
  PlacedHostBuffer(void* p, size_t n, std::unique_ptr<Buffer> pin) : p_(p), n_(n), pin_(std::move(pin)) {}
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  void* p_;
  size_t n_;
  std::unique_ptr<Buffer> pin_;
};
}  // namespace

WindowBuffers::WindowBuffers(Backend& be, const std::vector<BufferSpec>& specs, SharedHomeMemory shared)
    : bufs_(size_t(BufferRole::count_)), shared_(size_t(BufferRole::count_)) {
  const size_t need = shared_bytes(specs);
  SF_CHECK(need == 0 || (shared.base && shared.bytes >= need &&
                         reinterpret_cast<uintptr_t>(shared.base) % 4096 == 0),
           "the ranks' shared homes need a page-aligned region of ", need, " bytes, got ", shared.bytes,
           " at ", shared.base);
  size_t at = 0;
  for (const BufferSpec& s : specs) {
    auto& v = bufs_[size_t(s.role)];
    if (v.size() <= size_t(s.index)) v.resize(size_t(s.index) + 1);
    SF_CHECK(!v[size_t(s.index)], "buffer spec listed twice: ", s.what);
    if (s.tier == Tier::host_shared) {
      auto& flags = shared_[size_t(s.role)];
      if (flags.size() <= size_t(s.index)) flags.resize(size_t(s.index) + 1, 0);
      flags[size_t(s.index)] = 1;
      void* p = static_cast<char*>(shared.base) + at;
      v[size_t(s.index)] = std::make_unique<PlacedHostBuffer>(p, s.bytes, be.map_host(p, s.bytes, s.what));
      at += tier_bytes(s);
      continue;
    }
    v[size_t(s.index)] = s.tier == Tier::device ? be.alloc(s.bytes, s.what) : be.alloc_host(s.bytes, s.what);
  }
}

Buffer* WindowBuffers::find(BufferRole r, int index) const {
  const auto& v = bufs_[size_t(r)];
  return size_t(index) < v.size() ? v[size_t(index)].get() : nullptr;
}

bool WindowBuffers::shared(BufferRole r, int index) const {
  const auto& v = shared_[size_t(r)];
  return size_t(index) < v.size() && v[size_t(index)] != 0;
}

Buffer& WindowBuffers::at(BufferRole r, int index) const {
  Buffer* b = find(r, index);
  SF_CHECK(b, "the sliding window has no buffer of role ", int(r), " index ", index);
  return *b;
}

}  // namespace sf
