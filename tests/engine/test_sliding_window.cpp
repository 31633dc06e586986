// The sliding-window engine against the plain resident step, on the host backend: same
// losses and same weights after several steps, for every architecture, with and without
// clipping, with gradient accumulation, with tied embeddings, with micro-batches split into
// chunks and with the activation store in either tier; the same on lazy threaded streams,
// which also show that an engine omitting a wait or a synchronize gives wrong results.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "backend/forwarding_backend.h"
#include "backend/host/host_backend.h"
#include "backend/threaded_streams_backend.h"
#include "engine/device_resident_executor.h"
#include "engine/resident_executor.h"
#include "engine/schedule.h"
#include "engine/sliding_executor.h"
#include "engine/window_buffers.h"
#include "model/model_init.h"

using namespace sf;

namespace {

// Packed rows of random tokens; a few labels ignored so the mask path is exercised.
Batch random_batch(const ModelConfig& cfg, int rows, int seq_len, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> r(static_cast<size_t>(rows));
  for (auto& row : r)
    for (int i = 0; i < seq_len + (int(g() % 3)); ++i) row.push_back(int32_t(g() % uint64_t(cfg.vocab_size)));
  Batch b = Batch::from_rows(r);
  for (size_t i = 0; i < b.labels.size(); i += 7) b.labels[i] = kIgnoreLabel;
  return b;
}

// The same initial weights (init_unit with `seed`) in two executors, pushed to their devices
// (written as fp32: a bf16 master encodes them the same way in both).
void same_start(const ModelConfig& cfg, StepExecutor& a, StepExecutor& b, uint64_t seed,
                const InitOptions& init = {}) {
  ModelLayout layout = ModelLayout::build(cfg);
  for (int u = 0; u < a.params().n_units(); ++u) {
    std::vector<float> w(size_t(layout.units[size_t(u)].numel), 0.f);
    init_unit(layout.units[size_t(u)], w.data(), seed, init);
    a.params().write_master_f32(u, w.data());
    b.params().write_master_f32(u, w.data());
  }
  a.params_changed();
  b.params_changed();
}

// Unit u's weights as fp32, whatever the state's format.
std::vector<float> master_f32(ParamStore& p, int u) {
  std::vector<float> w(size_t(p.numel(u)), 0.f);
  p.read_master_f32(u, w.data());
  return w;
}

// The bytes of one buffer of both states.
void expect_same_bytes(const void* x, const void* y, size_t bytes, const char* what, int u) {
  ASSERT_EQ(std::memcmp(x, y, bytes), 0) << what << " of unit " << u;
}

// Every unit's master (and, with moments, AdamW m, v and their scales) bitwise equal in both,
// in the format the states share.
void expect_same_state(StepExecutor& a, StepExecutor& b, bool moments) {
  ParamStore &pa = a.params(), &pb = b.params();
  ASSERT_EQ(pa.format(), pb.format());
  for (int u = 0; u < pa.n_units(); ++u) {
    const UnitStateView x = pa.state(u), y = pb.state(u);
    const UnitStateLayout& l = pa.layout(u);
    expect_same_bytes(x.master, y.master, l.master_bytes, "master", u);
    if (!moments) continue;
    expect_same_bytes(x.m, y.m, l.moment_bytes, "m", u);
    expect_same_bytes(x.v, y.v, l.moment_bytes, "v", u);
    if (l.scale_count > 0) {
      expect_same_bytes(x.m_scale, y.m_scale, size_t(l.scale_count) * 4, "m scales", u);
      expect_same_bytes(x.v_scale, y.v_scale, size_t(l.scale_count) * 4, "v scales", u);
    }
  }
}

// A host backend whose streams are threads that run an op only once something waits for
// it, never because time passed: an ordering the engine forgot (an event wait, a synchronize
// before the host reads) lets a consumer run before its producer, as it could on a GPU, and
// changes the bits, on every run and under any load (SlidingWindow.LazyStreamsCatchAnOmittedWaitOrSynchronize).
struct LazyStreams {
  static ThreadedStreamsBackend::Options lazy() {
    ThreadedStreamsBackend::Options o;
    o.lazy = true;
    return o;
  }
  HostBackend host;
  ThreadedStreamsBackend be{host, lazy()};
};

struct Case {
  Arch arch;
  bool tied;
  float max_grad_norm;
  int grad_accum;
  int64_t chunk_tokens;  // engine chunk; smaller than a micro-batch splits it
  bool acts_on_device;
  int resident_layers = 0;  // homes on the device
  bool speculative = false;
  int next_units = -1;  // speculative: units with a "next" buffer (-1 all)
  bool spec_all = false;   // speculative: phase A speculates every unit it can (deterministic redo coverage)
  int dev_adamw = 0;  // the first layers' optimizer on the "device" (device_adamw_layers)
  bool threaded = false;  // the engine's backend runs its streams on threads (lazy)
  bool moments_on_disk = false;  // AdamW m and v in a file (ParamStore's moments_dir)
  bool grads_on_compute = false;  // EngineConfig::grads_stream off
  bool from_master = false;  // EngineConfig::HostWeights::master (no layer homes; qwen3: head resident)
  StateFormat state;  // the host state's format (both executors)
  int64_t mlp_tile = 0;  // EngineConfig::mlp_tile_tokens when > 0 (smaller than a chunk: tiled MLP)
  int disk_units = -1;  // moments on disk: of this many units only (EngineConfig::disk_moment_units)
  int kept_attention = 0;  // EngineConfig::kept_attention_layers
  bool kept_on_host = false;  // their attention store in pinned host memory
  int checkpoint_every = 1;  // EngineConfig::checkpoint_every (the other layers' inputs replayed)
  int strided_from = 0;      // EngineConfig::strided_from (the layers below save their inputs)
  int layers = 0;            // the model's layers when > 0 (the tiny config's otherwise)
  bool masters_on_disk = false;  // the disk units' bf16 masters in the file too
  std::string name() const {
    return cat(arch_name(arch), tied ? "_tied" : "", max_grad_norm > 0 ? "_clip" : "",
               "_accum", grad_accum, "_chunk", chunk_tokens, acts_on_device ? "_devacts" : "",
               resident_layers ? cat("_resident", resident_layers) : "",
               speculative ? "_speculative" : "", next_units >= 0 ? cat("_next", next_units) : "",
               spec_all ? "_specall" : "", dev_adamw ? cat("_devadamw", dev_adamw) : "",
               moments_on_disk ? "_diskmoments" : "", grads_on_compute ? "_gradsoncompute" : "",
               from_master ? "_frommaster" : "",
               state.is_fp32() ? std::string()
                               : cat("_", master_format_name(state.master), "master_",
                                     moment_format_name(state.moments), "moments"),
               mlp_tile ? cat("_mlptile", mlp_tile) : "", disk_units >= 0 ? cat("_diskunits", disk_units) : "",
               kept_attention ? cat("_keptattn", kept_attention, kept_on_host ? "host" : "dev") : "",
               checkpoint_every > 1 ? cat("_ckpt", checkpoint_every) : "",
               strided_from ? cat("_from", strided_from) : "", layers ? cat("_layers", layers) : "",
               masters_on_disk ? "_diskmasters" : "");
  }
};

// A pass-through decorator that records the most rows a swiglu_forward had: the MLP tile
// the engine's layers actually ran (the cases with EngineConfig::mlp_tile_tokens).
class SwigluRows final : public PassThroughBackend {
 public:
  explicit SwigluRows(Backend& in) : PassThroughBackend(in) {}
  std::string name() const override { return in_.name() + " (swiglu rows)"; }
  void swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) override {
    max_rows = std::max(max_rows, out.rows);
    ForwardingBackend::swiglu_forward(s, out, gate, up);
  }
  int64_t max_rows = 0;  // ops are enqueued by the engine's thread only
};

class SlidingVsResident : public ::testing::TestWithParam<Case> {};

TEST_P(SlidingVsResident, SameLossesAndWeights) {
  const Case& tc = GetParam();
  SCOPED_TRACE(tc.name());
  ModelConfig cfg = tiny_config(tc.arch, tc.tied);
  if (tc.dev_adamw > 2) cfg.num_hidden_layers = 4;  // layer 2 on the device: its own accumulator
  if (tc.layers > 0) cfg.num_hidden_layers = tc.layers;
  const int rows = 2, seq = 12;
  InitOptions init;
  init.norm_jitter = 0.1f;
  init.bias_std = 0.05f;

  HostBackend be_ref, be_host;
  ResidentExecutor ref(be_ref, cfg, rows * (seq + 2), false, 256, tc.state);
  LazyStreams lazy;
  Backend& be_inner = tc.threaded ? static_cast<Backend&>(lazy.be) : be_host;
  SwigluRows rows_seen(be_inner);
  Backend& be_eng = tc.mlp_tile > 0 ? static_cast<Backend&>(rows_seen) : be_inner;
  EngineConfig ec;
  ec.state_format = tc.state;
  ec.n_slots = 2;
  ec.max_chunk_tokens = tc.chunk_tokens;
  ec.max_chunks = 8;
  ec.head_chunk_rows = 256;  // the reference model's default: same LM-head chunking
  ec.activations_on_device = tc.acts_on_device;
  // Split tiers (layer 0 on the device, the rest on the host) in the resident-home cases.
  if (tc.resident_layers > 0 && !tc.acts_on_device) ec.device_act_layers = 1;
  ec.resident_layers = tc.resident_layers;
  ec.head_resident = tc.resident_layers > 0 || (tc.from_master && tc.arch == Arch::qwen3);
  if (tc.from_master) ec.host_weights = EngineConfig::HostWeights::master;
  // always: every step speculates, so the clipping cases exercise the rollback.
  ec.speculation = tc.speculative ? EngineConfig::Speculation::always : EngineConfig::Speculation::off;
  ec.next_units = tc.next_units;
  EngineTestModes test;
  test.speculate_everything = tc.spec_all;
  // The round still runs when the next step starts (the next step must not reset what it reads).
  if (tc.from_master && tc.threaded) test.landing_delay_ms = 5;
  ec.device_adamw_layers = tc.dev_adamw;
  ec.ring_piece = 777;  // device homes' update trips in many pieces (odd size: ragged last one)
  if (tc.moments_on_disk) ec.moments_dir = ::testing::TempDir();
  ec.disk_moment_units = tc.disk_units;
  ec.masters_on_disk = tc.masters_on_disk;
  ec.moments_streamed = tc.moments_on_disk && tc.arch != Arch::llama;  // both ways
  ec.grads_stream = !tc.grads_on_compute;
  ec.kept_attention_layers = tc.kept_attention;
  ec.kept_attention_on_device = !tc.kept_on_host;
  ec.checkpoint_every = tc.checkpoint_every;
  ec.strided_from = tc.strided_from;
  if (tc.mlp_tile > 0) {
    ec.mlp_tile_tokens = tc.mlp_tile;
    // The tile is in effect: the window's layer scratch is smaller than the untiled chunk's.
    EngineConfig untiled = ec;
    untiled.mlp_tile_tokens = 0;
    auto scratch = [&](const EngineConfig& e) {
      for (const BufferSpec& b : window_buffer_specs(cfg, e, DType::f32))
        if (b.role == BufferRole::scratch) return b.bytes;
      return size_t(0);
    };
    EXPECT_LT(scratch(ec), scratch(untiled));
  }
  SlidingWindowExecutor eng(be_eng, cfg, ec, test);
  ASSERT_EQ(eng.params().moments_on_disk(), tc.moments_on_disk);
  if (tc.disk_units >= 0) {
    int on_disk = 0;
    for (int u = 0; u < eng.params().n_units(); ++u) on_disk += eng.params().moments_on_disk(u);
    ASSERT_EQ(on_disk, tc.disk_units);
    ASSERT_LT(on_disk, eng.params().n_units());
  }
  int masters_on_disk = 0;
  for (int u = 0; u < eng.params().n_units(); ++u) masters_on_disk += eng.params().master_on_disk(u);
  if (tc.masters_on_disk) {  // the disk units' but the embedding's
    const int n = eng.params().n_units();
    ASSERT_EQ(masters_on_disk, tc.disk_units < 0 ? n - 1 : std::min(tc.disk_units, n - 1));
  } else {
    ASSERT_EQ(masters_on_disk, 0);
  }

  same_start(cfg, ref, eng, 42, init);

  OptimHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1f;
  h.max_grad_norm = tc.max_grad_norm;
  bool clipped = false;
  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> micro;
    for (int m = 0; m < tc.grad_accum; ++m)
      micro.push_back(random_batch(cfg, rows, seq, uint64_t(100 * step + m)));
    StepStats a = ref.train_step(micro, h);
    StepStats b = eng.train_step(micro, h);
    // Same arithmetic up to fp32 summation order (chunk splits, loss accumulated in f32).
    EXPECT_NEAR(b.loss(), a.loss(), 1e-5 * a.loss()) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
    EXPECT_EQ(a.n_valid, b.n_valid);
    clipped |= a.clip_coef < 1;
  }
  if (tc.max_grad_norm > 0 && tc.max_grad_norm < 10) {
    EXPECT_TRUE(clipped) << "the clipping case must actually clip";
  }
  if (tc.mlp_tile > 0) {
    EXPECT_GT(rows_seen.max_rows, 0);
    EXPECT_LE(rows_seen.max_rows, tc.mlp_tile);
  }
  // Weights after 3 updates. When every micro-batch is one chunk and the embeddings are
  // untied, the engine performs the reference's operations in the reference's order: the
  // weights must be bitwise equal. Otherwise the summation order of some gradients differs
  // (chunk splits accumulate dW in pieces; the tied table sums head and embedding parts in
  // another order); AdamW divides by sqrt(v), so an element whose gradient nearly cancels can
  // move its step by a visible fraction of lr (3e-3): allow 1e-3 lr per step.
  // A tiled MLP rounds its GEMM rows differently (tests/model/test_mlp_tiles.cpp) and
  // accumulates its weight gradients tile by tile: fp32 rounding again.
  // A speculative step that had to clip was rolled back algebraically: fp32 rounding again.
  // A clipped step's coefficient comes from a norm that sums per-unit f32 reductions (the
  // device's, for the untied embedding, resident homes and layer 0 with its AdamW on the
  // device) where the reference sums in double: it can differ by an ulp, which AdamW turns
  // into up to ~1e-4 lr per step.
  // A compact state turns such a difference into a different code or bf16 rounding now and
  // then: an int8 moment one map step (<= 4.4%) off moves its update by that share of lr, a
  // bf16 master one ulp (~1e-4 at these weights): allow 0.1 lr per step.
  const bool same_order = !tc.tied && tc.chunk_tokens >= rows * (seq + 2) &&
                          !(tc.speculative && clipped) && tc.mlp_tile == 0;
  const double rounding_tol = tc.state.is_fp32() ? 1e-3 : 0.1;
  const double clip_tol = tc.state.is_fp32() ? 1e-4 : rounding_tol;  // an ulp of the coefficient, rounded
  const double tol = !same_order ? 3 * rounding_tol * h.lr : clipped ? 3 * clip_tol * h.lr : 0.0;
  // Where the order differs, an element whose gradient is itself rounding noise has an AdamW
  // step (lr x m / sqrt(v)) that the noise decides: up to one in a thousand may go past tol,
  // never past the two runs' steps pointing apart (2 lr a step, 3 steps); a wrong gradient
  // moves far more elements than that.
  double max_diff = 0;
  int64_t past_tol = 0, n_params = 0;
  for (int u = 0; u < ref.params().n_units(); ++u) {
    const std::vector<float> x = master_f32(ref.params(), u), y = master_f32(eng.params(), u);
    for (int64_t i = 0; i < ref.params().numel(u); ++i) {
      const double d = std::fabs(x[size_t(i)] - y[size_t(i)]);
      max_diff = std::max(max_diff, d);
      past_tol += d > tol;
    }
    n_params += ref.params().numel(u);
  }
  if (tol == 0.0) {
    EXPECT_EQ(max_diff, 0.0);
  } else {
    EXPECT_LE(past_tol, std::max<int64_t>(1, n_params / 1000)) << "of " << n_params << " past " << tol;
    EXPECT_LE(max_diff, 6.0 * h.lr);
  }
  if (tol == 0.0) expect_same_state(ref, eng, true);  // the optimizer state too (checkpoints carry it)
  // Evaluation through the engine's forward-only schedule.
  Batch e = random_batch(cfg, rows, seq, 999);
  double la = ref.eval_loss_sum(e), lb = eng.eval_loss_sum(e);
  EXPECT_NEAR(lb, la, 1e-5 * la);
  // Every op the engine enqueued ran because something waited for it: no step relied on a
  // stream making progress by itself (the lazy streams never run an op unasked; a host that
  // polls query() instead of waiting is counted here). A count of polls, not a timeout, so
  // the machine's load cannot change it.
  EXPECT_EQ(lazy.be.ops_run_unforced(), 0u);
}

Case from_master(Case c) {
  c.from_master = true;
  return c;
}

Case in_format(Case c, MomentFormat moments, MasterFormat master) {
  c.state = StateFormat{moments, master};
  return c;
}

Case mlp_tiled(Case c, int64_t tile) {
  c.mlp_tile = tile;
  return c;
}

// The first `layers` layers keep their attention for the backward, on the device or the host.
Case kept_attention(Case c, int layers, bool on_host) {
  c.kept_attention = layers;
  c.kept_on_host = on_host;
  return c;
}

// Only every n-th layer's input saved (of `layers`), the others' replayed in the backward.
Case checkpoint_every(Case c, int n, int layers) {
  c.checkpoint_every = n;
  c.layers = layers;
  return c;
}

// Every n-th layer's input saved from layer `from` up only (the layers below save theirs).
Case strided_from(Case c, int n, int layers, int from) {
  c = checkpoint_every(c, n, layers);
  c.strided_from = from;
  return c;
}

// Moments on disk for `units` of the units only, the others' in RAM.
Case disk_units(Case c, int units) {
  c.moments_on_disk = true;
  c.disk_units = units;
  return c;
}

// A bf16 master (with `moments`) in the file with its unit's moments, of `units` units (-1 all).
Case masters_on_disk(Case c, MomentFormat moments, int units) {
  c = disk_units(in_format(c, moments, MasterFormat::bf16), units);
  c.masters_on_disk = true;
  return c;
}

std::vector<Case> engine_cases() {
  return {Case{Arch::llama, false, 0.f, 1, 64, false},
          Case{Arch::mistral, false, 0.f, 1, 64, false},
          Case{Arch::qwen2, false, 0.f, 1, 64, false},
          Case{Arch::qwen3, false, 0.f, 1, 64, false},
          Case{Arch::llama, false, 0.05f, 1, 64, false},
          Case{Arch::qwen3, false, 0.05f, 2, 64, false},
          Case{Arch::qwen2, true, 0.f, 1, 64, false},
          Case{Arch::qwen3, true, 0.05f, 2, 64, true},
          Case{Arch::llama, false, 0.f, 3, 16, false},
          Case{Arch::mistral, true, 0.5f, 2, 16, true},
          Case{Arch::llama, false, 0.05f, 1, 64, false, 1},
          Case{Arch::qwen3, true, 0.f, 2, 16, true, 2},
          Case{Arch::llama, false, 0.f, 1, 64, false, 0, true},
          Case{Arch::qwen2, false, 0.05f, 1, 64, false, 1, true},
          Case{Arch::qwen3, true, 0.05f, 2, 16, true, 2, true},
          Case{Arch::mistral, false, 50.f, 1, 64, false, 0, true},
          // Phase A takes every unit: clipped steps redo each speculated unit.
          Case{Arch::llama, false, 0.05f, 1, 64, false, 0, true, -1, true},
          Case{Arch::qwen3, true, 0.05f, 2, 16, true, 2, true, -1, true},
          Case{Arch::mistral, false, 50.f, 1, 64, false, 1, true, -1, true},
          // Layer 0's AdamW on the device: deferred and speculative, clipped,
          // tied, split chunks, with and without other resident homes.
          Case{Arch::llama, false, 0.f, 1, 64, false, 0, false, -1, false, 1},
          Case{Arch::qwen2, false, 0.05f, 1, 64, false, 2, false, -1, false, 1},
          Case{Arch::llama, false, 0.05f, 1, 64, false, 0, true, -1, false, 1},
          Case{Arch::qwen3, true, 0.05f, 2, 16, true, 1, true, -1, true, 1},
          Case{Arch::mistral, false, 0.f, 3, 16, false, 0, true, -1, false, 1},
          // Layers 0-2 of 4 (layer 2 accumulates into its own buffer), and all of 2.
          Case{Arch::llama, false, 0.f, 1, 64, false, 0, false, -1, false, 3},
          Case{Arch::qwen2, false, 0.05f, 2, 16, false, 1, true, -1, false, 3},
          Case{Arch::qwen3, false, 0.f, 1, 64, false, 0, true, -1, false, 2},
          // The AdamW moments in a file on disk: the same bits (deferred, speculative with
          // clipping and redo, tied with split chunks and device AdamW).
          Case{Arch::llama, false, 0.f, 1, 64, false, 0, false, -1, false, 0, false, true},
          Case{Arch::mistral, false, 0.05f, 1, 64, false, 0, true, -1, true, 0, false, true},
          Case{Arch::qwen3, true, 0.05f, 2, 16, true, 1, true, -1, false, 1, false, true},
          // The gradients' casts and norms on the compute stream (the grads stream off).
          Case{Arch::llama, false, 0.05f, 1, 64, false, 1, true, -1, false, 0, false, false, true},
          Case{Arch::qwen3, true, 0.f, 2, 16, true, 0, false, -1, false, 1, false, false, true},
          // Weights from the master, each gradient applied as it lands (no clipping): one
          // chunk, split chunks with accumulation, tied with a resident head, moments on disk.
          from_master(Case{Arch::llama, false, 0.f, 1, 64, false}),
          from_master(Case{Arch::mistral, false, 0.f, 3, 16, false}),
          from_master(Case{Arch::qwen3, true, 0.f, 2, 16, true}),
          from_master(Case{Arch::qwen2, false, 0.f, 1, 64, false, 0, false, -1, false, 0, false, true}),
          from_master(Case{Arch::qwen3, false, 0.f, 2, 64, false, 0, false, -1, false, 0, false, false, true}),
          // Compact states (optim/state_format.h): the deferred update waiting for the norm
          // (clipping on, not clipping), clipped, resident homes in ring pieces, moments on
          // disk, split chunks and tied tables (not the same order), and from the master.
          in_format(Case{Arch::llama, false, 0.f, 1, 64, false}, MomentFormat::int8, MasterFormat::f32),
          in_format(Case{Arch::qwen3, false, 50.f, 1, 64, false}, MomentFormat::int8, MasterFormat::bf16),
          in_format(Case{Arch::qwen2, false, 0.05f, 1, 64, false}, MomentFormat::bf16, MasterFormat::f32),
          in_format(Case{Arch::mistral, false, 50.f, 1, 64, false, 1}, MomentFormat::int8, MasterFormat::f32),
          in_format(Case{Arch::llama, false, 0.f, 1, 64, false, 0, false, -1, false, 0, false, true},
                    MomentFormat::int8, MasterFormat::bf16),
          in_format(Case{Arch::qwen2, true, 0.05f, 2, 16, true}, MomentFormat::bf16, MasterFormat::bf16),
          in_format(from_master(Case{Arch::llama, false, 0.f, 1, 64, false}), MomentFormat::int8, MasterFormat::bf16),
          in_format(from_master(Case{Arch::qwen3, true, 0.f, 2, 16, true}), MomentFormat::int8, MasterFormat::f32),
          // Device-AdamW layers over a compact state (the backend's adamw_state).
          in_format(Case{Arch::llama, false, 0.f, 1, 64, false, 0, false, -1, false, 1}, MomentFormat::int8,
                    MasterFormat::bf16),
          in_format(Case{Arch::qwen2, false, 50.f, 1, 64, false, 2, false, -1, false, 3}, MomentFormat::int8,
                    MasterFormat::f32),
          // The MLP in token tiles smaller than the chunk (not dividing it): one chunk per
          // micro-batch; split chunks with clipping, accumulation and tied embeddings
          // (qk_norm); a resident home and speculation (qkv bias); weights from the master.
          mlp_tiled(Case{Arch::llama, false, 0.f, 1, 64, false}, 5),
          mlp_tiled(Case{Arch::qwen3, true, 0.05f, 2, 16, true}, 6),
          mlp_tiled(Case{Arch::qwen2, false, 0.05f, 1, 64, false, 1, true}, 7),
          mlp_tiled(from_master(Case{Arch::mistral, false, 0.f, 3, 16, false}), 3),
          // Some units' moments on disk, the others' in RAM: one layer (deferred; tied, int8,
          // bf16 master, split chunks), both layers and the head (speculative, clipped, redo),
          // and from the master (each gradient applied as it lands).
          disk_units(Case{Arch::llama, false, 0.f, 1, 64, false}, 1),
          disk_units(Case{Arch::mistral, false, 0.05f, 1, 64, false, 0, true, -1, true}, 3),
          disk_units(in_format(Case{Arch::qwen3, true, 0.05f, 2, 16, true}, MomentFormat::int8, MasterFormat::bf16), 1),
          disk_units(from_master(Case{Arch::qwen2, false, 0.f, 1, 64, false}), 2),
          // bf16 masters on disk with their moments: every unit's but the embedding's in one
          // chunk (bitwise; cached, int8); one layer's, tied, clipped, split chunks
          // (streamed); resident homes and bf16 moments, clipped; fp32
          // moments with a device-AdamW layer; every 2nd layer's input saved.
          masters_on_disk(Case{Arch::llama, false, 0.f, 1, 64, false}, MomentFormat::int8, -1),
          masters_on_disk(Case{Arch::qwen3, true, 0.05f, 2, 16, true}, MomentFormat::int8, 1),
          masters_on_disk(Case{Arch::mistral, false, 0.05f, 1, 64, false, 1}, MomentFormat::bf16, -1),
          masters_on_disk(Case{Arch::qwen2, false, 0.f, 1, 64, false, 0, false, -1, false, 1}, MomentFormat::f32, 3),
          checkpoint_every(masters_on_disk(Case{Arch::llama, false, 50.f, 1, 64, false}, MomentFormat::int8, 2), 2, 5),
          // Kept attention (no attention forward in the backward): every layer's on the
          // device and on the host in one chunk (bitwise: the reference's order); split
          // chunks with accumulation; qk_norm with clipping; one layer of two with resident
          // homes and speculation; from the master; a tiled MLP.
          kept_attention(Case{Arch::llama, false, 0.f, 1, 64, false}, 2, false),
          kept_attention(Case{Arch::qwen3, false, 0.05f, 1, 64, false}, 2, true),
          kept_attention(Case{Arch::mistral, false, 0.f, 3, 16, false}, 2, false),
          kept_attention(Case{Arch::qwen3, true, 0.05f, 2, 16, true}, 2, true),
          kept_attention(Case{Arch::qwen2, false, 0.05f, 1, 64, false, 1, true}, 1, true),
          kept_attention(from_master(Case{Arch::llama, false, 0.f, 3, 16, false}), 2, true),
          kept_attention(from_master(Case{Arch::qwen3, true, 0.f, 2, 16, true}), 1, false),
          kept_attention(mlp_tiled(Case{Arch::mistral, true, 0.5f, 2, 16, true}, 5), 2, true),
          // Only every 2nd / 3rd layer's input saved, the others' replayed in the backward:
          // one chunk (bitwise), 5 layers (a segment of one at the top); split chunks with
          // accumulation, tied, clipped; the store on the device; resident homes with
          // speculation; after kept-attention layers (host); from the master; a compact state
          // with some moments on disk.
          checkpoint_every(Case{Arch::llama, false, 0.f, 1, 64, false}, 2, 4),
          checkpoint_every(Case{Arch::qwen2, false, 0.05f, 1, 64, false}, 3, 5),
          checkpoint_every(Case{Arch::qwen3, true, 0.05f, 2, 16, false}, 2, 5),
          checkpoint_every(Case{Arch::mistral, false, 0.f, 3, 16, true}, 3, 6),
          checkpoint_every(Case{Arch::llama, false, 0.05f, 1, 64, false, 1, true}, 2, 5),
          checkpoint_every(kept_attention(Case{Arch::qwen3, false, 0.05f, 2, 16, false}, 1, true), 2, 4),
          checkpoint_every(from_master(Case{Arch::mistral, false, 0.f, 1, 64, false}), 3, 4),
          checkpoint_every(disk_units(in_format(Case{Arch::llama, false, 50.f, 1, 64, false}, MomentFormat::int8,
                                                MasterFormat::bf16), 2), 2, 4),
          // Only the top layers' (every 2nd / 3rd from a layer up): one chunk (bitwise), the
          // top layer replayed; clipped split chunks, the store split between the tiers with
          // resident homes; above a kept-attention layer (the stride from the higher of the two).
          strided_from(Case{Arch::llama, false, 0.f, 1, 64, false}, 2, 5, 3),
          strided_from(Case{Arch::qwen2, false, 0.05f, 2, 16, false, 2, true}, 2, 6, 2),
          strided_from(kept_attention(Case{Arch::qwen3, false, 0.05f, 2, 16, false}, 1, true), 3, 6, 2)};
}

// The same cases with the engine's streams on threads (its host-side ordering checked).
std::vector<Case> threaded(std::vector<Case> v) {
  for (Case& c : v) c.threaded = true;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Engine, SlidingVsResident, ::testing::ValuesIn(engine_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(ThreadedStreams, SlidingVsResident,
                         ::testing::ValuesIn(threaded(engine_cases())),
                         [](const auto& info) { return info.param.name(); });

// A 2-slot window with the last layer's and the head's homes resident (their update trips in
// 777-element ring pieces), speculative or deferred.
EngineConfig small_window(int64_t chunk, int max_chunks, bool speculative) {
  EngineConfig ec;
  ec.n_slots = 2;
  ec.max_chunk_tokens = chunk;
  ec.max_chunks = max_chunks;
  ec.resident_layers = 1;
  ec.head_resident = true;
  ec.ring_piece = 777;
  ec.speculation = speculative ? EngineConfig::Speculation::always : EngineConfig::Speculation::off;
  return ec;
}

// With clipping, a speculative step gives the same bits however far phase A got: here every
// unit speculated and redone vs none speculated (the norm is over the limit from the first
// unit on), on several architectures, with device homes in ring pieces.
TEST(SlidingWindow, ClippedSpeculativeStepsDoNotDependOnTiming) {
  for (Arch arch : {Arch::llama, Arch::qwen3}) {
    for (bool tied : {false, true}) {
      SCOPED_TRACE(cat(arch_name(arch), tied ? " tied" : ""));
      ModelConfig cfg = tiny_config(arch, tied);
      auto make = [&](HostBackend& be, bool all) {
        EngineTestModes test;
        test.speculate_everything = all;
        return std::make_unique<SlidingWindowExecutor>(be, cfg, small_window(16, 8, true), test);
      };
      HostBackend be_a, be_b;
      auto a = make(be_a, true), b = make(be_b, false);
      same_start(cfg, *a, *b, 9);
      OptimHyper h;
      h.lr = 3e-3;
      h.weight_decay = 0.1f;
      h.max_grad_norm = 0.05f;
      for (int step = 0; step < 3; ++step) {
        std::vector<Batch> micro = {random_batch(cfg, 2, 12, uint64_t(40 + step))};
        StepStats sa = a->train_step(micro, h), sb = b->train_step(micro, h);
        ASSERT_LT(sa.clip_coef, 1.0);
        EXPECT_EQ(sa.loss_sum, sb.loss_sum) << "step " << step;
      }
      expect_same_state(*a, *b, false);
    }
  }
}

// Counts the attention forwards the engine enqueues (the kept layers' backward runs none).
class AttentionForwards final : public PassThroughBackend {
 public:
  explicit AttentionForwards(Backend& in) : PassThroughBackend(in) {}
  std::string name() const override { return in_.name() + " (attention forwards counted)"; }
  void attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v, const AttentionShape& sh,
                         const int32_t* cu) override {
    ++count;
    ForwardingBackend::attention_forward(s, out, lse, q, k, v, sh, cu);
  }
  int count = 0;  // ops are enqueued by the engine's thread only
};

// Kept attention against the same window recomputing it: the same losses, norms and every
// bit of the state after three steps (the host backend's attention is deterministic), in
// every configuration the store meets: device and host store, one chunk and split chunks
// with accumulation, a qk_norm arch, tied embeddings, speculation, from the master, lazy
// threaded streams; the kept layers' backward enqueues no attention forward.
TEST(SlidingWindow, KeptAttentionGivesTheRecomputedBits) {
  struct KeptCase {
    Arch arch;
    bool tied;
    int grad_accum;
    int64_t chunk;
    bool on_host, threaded, speculative, master;
    int layers;  // of the model's 3
  };
  for (const KeptCase& kc : {KeptCase{Arch::llama, false, 1, 64, false, false, false, false, 3},
                             KeptCase{Arch::llama, false, 1, 64, true, true, false, false, 3},
                             KeptCase{Arch::qwen3, true, 2, 16, true, false, true, false, 3},
                             KeptCase{Arch::qwen3, true, 2, 16, false, true, true, false, 2},
                             KeptCase{Arch::mistral, false, 3, 16, true, true, false, true, 3},
                             KeptCase{Arch::qwen2, false, 2, 16, true, true, true, false, 1}}) {
    ModelConfig cfg = tiny_config(kc.arch, kc.tied);
    cfg.num_hidden_layers = 3;
    SCOPED_TRACE(cat(arch_name(kc.arch), kc.tied ? " tied" : "", ", accum ", kc.grad_accum, ", chunk ", kc.chunk,
                     kc.on_host ? ", host store" : ", device store", kc.threaded ? ", threaded" : "",
                     kc.speculative ? ", speculative" : "", kc.master ? ", from the master" : "", ", ", kc.layers,
                     " layers kept"));
    EngineConfig ec;
    ec.max_chunk_tokens = kc.chunk;
    ec.max_chunks = 8;
    ec.ring_piece = 777;
    if (kc.speculative) ec.speculation = EngineConfig::Speculation::always;
    if (kc.master) ec.host_weights = EngineConfig::HostWeights::master;
    EngineConfig kept = ec;
    kept.kept_attention_layers = kc.layers;
    kept.kept_attention_on_device = !kc.on_host;
    HostBackend host_a, host_b;
    LazyStreams lazy_a, lazy_b;
    AttentionForwards count_a(kc.threaded ? static_cast<Backend&>(lazy_a.be) : host_a);
    AttentionForwards count_b(kc.threaded ? static_cast<Backend&>(lazy_b.be) : host_b);
    SlidingWindowExecutor recompute(count_a, cfg, ec), keeping(count_b, cfg, kept);
    same_start(cfg, recompute, keeping, 7);
    OptimHyper h;
    h.lr = 3e-3;
    h.max_grad_norm = kc.master ? 0.f : 0.05f;  // clipping where the mode allows it
    int chunks = 0;
    for (int step = 0; step < 3; ++step) {
      std::vector<Batch> micro;
      // Step 1 has one micro-batch: another chunk count, schedule and store layout in between.
      for (int m = 0; m < (step == 1 ? 1 : kc.grad_accum); ++m)
        micro.push_back(random_batch(cfg, 2, 12, uint64_t(10 * step + m)));
      chunks += int(recompute.make_chunks(micro).size());
      const StepStats a = recompute.train_step(micro, h), b = keeping.train_step(micro, h);
      EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    }
    expect_same_state(recompute, keeping, true);
    // Forward and backward recompute per layer and chunk; the kept layers skip the latter.
    const int L = int(cfg.num_hidden_layers);
    EXPECT_EQ(count_a.count, 2 * L * chunks);
    EXPECT_EQ(count_b.count, (2 * L - kc.layers) * chunks);
    EXPECT_EQ(lazy_a.be.ops_run_unforced() + lazy_b.be.ops_run_unforced(), 0u);
  }
}

// The untied embedding gradient is scattered on the device into two row blocks (the forward's
// X buffers); splitting the rows over both gives the bits of one block. The unit's norm is not
// bitwise: each block's sum of squares lands in the f32 norm slot (float(float(a) + b) against
// float(a + b)), so it is compared to a float ulp, and the steps run unclipped so that the
// norm cannot reach the weights. (With clipping the comparison held or failed by the last bit
// of OpenBLAS's CPU-specific kernels.)
TEST(SlidingWindow, EmbeddingScatterInTwoBlocksIsExact) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  auto make = [&](HostBackend& be, bool split) {
    EngineTestModes test;
    test.split_embedding_scatter = split;
    return std::make_unique<SlidingWindowExecutor>(be, cfg, small_window(16, 8, true), test);
  };
  HostBackend be_a, be_b;
  auto a = make(be_a, true), b = make(be_b, false);
  same_start(cfg, *a, *b, 9);
  OptimHyper h;
  h.lr = 3e-3;
  h.max_grad_norm = 0.f;
  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> micro = {random_batch(cfg, 2, 12, uint64_t(60 + step)),
                                random_batch(cfg, 2, 12, uint64_t(70 + step))};
    StepStats sa = a->train_step(micro, h), sb = b->train_step(micro, h);
    EXPECT_EQ(sa.loss_sum, sb.loss_sum) << "step " << step;
    EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 2 * 0x1p-24 * sb.grad_norm) << "step " << step;
  }
  const float* ea = a->params().master(0);
  const float* eb = b->params().master(0);
  for (int64_t i = 0; i < a->params().numel(0); ++i) ASSERT_EQ(ea[i], eb[i]) << "element " << i;
}

// A checkpoint mid-run (params(): the device-AdamW layers' state comes home) loaded into an
// executor that places the optimizer differently (params_changed(): it goes to the device
// again) continues exactly as the reference, which never stopped: the state round-trips
// bitwise, whichever layers keep theirs on the device before and after.
TEST(SlidingWindow, CheckpointMovesDeviceAdamWStateExactly) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  cfg.num_hidden_layers = 4;
  const int rows = 2, seq = 12;
  for (auto [before, after] : {std::pair{3, 1}, std::pair{0, 4}, std::pair{2, 0}}) {
    SCOPED_TRACE(cat("device AdamW layers ", before, " then ", after));
    HostBackend be_ref;
    LazyStreams lazy_a, lazy_b;  // params() and params_changed() order their copies
    Backend &be_a = lazy_a.be, &be_b = lazy_b.be;
    ResidentExecutor ref(be_ref, cfg, rows * (seq + 2));
    EngineConfig ec = small_window(64, 2, false);
    ec.device_adamw_layers = before;
    SlidingWindowExecutor a(be_a, cfg, ec);
    same_start(cfg, ref, a, 11);
    OptimHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = 0;  // unclipped: same operations in the same order, bitwise
    auto step = [&](StepExecutor& e, int i) {
      std::vector<Batch> micro = {random_batch(cfg, rows, seq, uint64_t(500 + i))};
      return e.train_step(micro, h);
    };
    for (int i = 0; i < 2; ++i) {
      step(ref, i);
      step(a, i);
    }
    ec.device_adamw_layers = after;
    SlidingWindowExecutor b(be_b, cfg, ec);
    ParamStore& from = a.params();  // the checkpoint
    for (int u = 0; u < from.n_units(); ++u) {
      const size_t n = size_t(from.numel(u)) * sizeof(float);
      std::memcpy(b.params().master(u), from.master(u), n);
      std::memcpy(b.params().m(u), from.m(u), n);
      std::memcpy(b.params().v(u), from.v(u), n);
    }
    b.params().step = from.step;
    b.params_changed();
    for (int i = 2; i < 4; ++i) {
      StepStats r = step(ref, i), x = step(b, i);
      EXPECT_EQ(r.loss(), x.loss()) << "step " << i;
    }
    expect_same_state(ref, b, true);
    EXPECT_EQ(lazy_a.be.ops_run_unforced(), 0u);
    EXPECT_EQ(lazy_b.be.ops_run_unforced(), 0u);
  }
}

// A step whose gradients are not finite is skipped, as the reference skips it: the speculative
// engine undoes what it had already applied (here the embedding rows the step did not touch,
// updated during the backward), so the weights come back within fp32 rounding of the undo.
TEST(SlidingWindow, NonFiniteStepIsSkippedAndUndone) {
  for (int mode = 0; mode < 4; ++mode) {
    const bool speculative = mode % 2 == 1;
    const int dev_adamw = mode >= 2 ? 3 : 0;
    SCOPED_TRACE(cat(speculative ? "speculative" : "deferred", dev_adamw ? ", AdamW on the device" : ""));
    ModelConfig cfg = tiny_config(Arch::llama, false);
    cfg.num_hidden_layers = 4;
    LazyStreams lazy;  // the undo reads what the device-AdamW layers and phase A wrote
    Backend& be = lazy.be;
    EngineConfig ec = small_window(64, 2, speculative);
    ec.device_adamw_layers = dev_adamw;
    EngineTestModes test;
    test.speculate_everything = speculative;
    SlidingWindowExecutor eng(be, cfg, ec, test);
    ModelLayout layout = ModelLayout::build(cfg);
    for (int u = 0; u < eng.params().n_units(); ++u) init_unit(layout.units[size_t(u)], eng.params().master(u), 7);
    eng.params_changed();
    OptimHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = 1.0f;
    std::vector<Batch> micro = {random_batch(cfg, 2, 12, 5)};
    eng.train_step(micro, h);  // a normal step first: non-zero moments
    // Poison one weight of the last layer: loss and every gradient become non-finite.
    ParamStore& ps = eng.params();
    const int last = ps.n_units() - 2;
    std::vector<std::vector<float>> before;
    for (int u = 0; u < ps.n_units(); ++u) before.emplace_back(ps.master(u), ps.master(u) + ps.numel(u));
    const float keep = ps.master(last)[5];
    ps.master(last)[5] = std::numeric_limits<float>::infinity();
    eng.params_changed();
    StepStats st = eng.train_step(micro, h);
    EXPECT_FALSE(std::isfinite(st.grad_norm));
    EXPECT_EQ(st.clip_coef, 0.0);
    ps.master(last)[5] = keep;
    for (int u = 0; u < ps.n_units(); ++u)
      for (int64_t i = 0; i < ps.numel(u); ++i) {
        const float a = before[size_t(u)][size_t(i)], b = eng.params().master(u)[i];
        // Undoing a step restores within a few ulps (optim/adamw_undo.h); skipped: bitwise.
        ASSERT_LE(std::fabs(a - b), speculative ? 4e-7f * (std::fabs(a) + 1e-6f) : 0.f)
            << "unit " << u << " element " << i;
      }
    // Training goes on from there.
    eng.params_changed();
    StepStats next = eng.train_step(micro, h);
    EXPECT_TRUE(std::isfinite(next.loss()));
    EXPECT_EQ(lazy.be.ops_run_unforced(), 0u);
  }
}

// The schedule visits every layer once forward and once backward per step, loads each
// layer's weights before computing with them, and keeps the last layers resident at the turn.
// From the master each gradient is applied as it lands, so a step cannot be skipped: a
// non-finite gradient fails the step with a message that says why and what to do, the unit
// whose gradient was not finite is left as it was, and a clipping step is refused up front.
void expect_error_contains(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one saying \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(SlidingWindow, FromMasterRefusesClippingAndFailsANonFiniteStep) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  LazyStreams lazy;
  EngineConfig ec = small_window(64, 2, false);
  ec.resident_layers = 0;
  ec.head_resident = false;
  ec.host_weights = EngineConfig::HostWeights::master;
  SlidingWindowExecutor eng(lazy.be, cfg, ec);
  ModelLayout layout = ModelLayout::build(cfg);
  for (int u = 0; u < eng.params().n_units(); ++u) init_unit(layout.units[size_t(u)], eng.params().master(u), 7);
  eng.params_changed();
  OptimHyper h;
  h.lr = 3e-3;
  h.max_grad_norm = 1.0f;
  std::vector<Batch> micro = {random_batch(cfg, 2, 12, 5)};
  expect_error_contains([&] { eng.train_step(micro, h); }, "--max-grad-norm 0");
  h.max_grad_norm = 0.f;
  StepStats ok = eng.train_step(micro, h);
  EXPECT_TRUE(std::isfinite(ok.grad_norm));
  EXPECT_GT(ok.grad_norm, 0.0);
  ParamStore& ps = eng.params();
  const int last = ps.n_units() - 2;
  ps.master(last)[5] = std::numeric_limits<float>::infinity();
  eng.params_changed();
  expect_error_contains([&] { eng.train_step(micro, h); }, "cannot be skipped");
  EXPECT_EQ(eng.params().master(last)[5], std::numeric_limits<float>::infinity());
}

// Replayed inputs are the forward's bits: a window that saves every 2nd or 3rd layer's input
// gives every bit of the one that saves all, in the cases the reference comparison above can
// only bound (split chunks, accumulation, tied tables, clipping, speculation with redo), on
// lazy threaded streams (the replay's ordering against the offloads and fetches).
TEST(SlidingWindow, ReplayedInputsGiveTheSavedInputsBits) {
  struct Sparse {
    Arch arch;
    bool tied;
    int every, layers, accum;
    float clip;
    bool speculative, acts_on_device;
    int from = 0;  // EngineConfig::strided_from: the layers below save their inputs
  };
  for (const Sparse& sc : {Sparse{Arch::mistral, false, 3, 4, 2, 0.f, false, false},
                           Sparse{Arch::qwen3, true, 2, 5, 2, 0.05f, true, false},
                           Sparse{Arch::llama, false, 2, 6, 3, 0.05f, false, true},
                           Sparse{Arch::qwen2, false, 3, 7, 1, 0.f, true, true},
                           Sparse{Arch::llama, false, 2, 6, 2, 0.05f, true, false, 3},
                           Sparse{Arch::qwen3, true, 3, 7, 1, 0.f, false, true, 4}}) {
    SCOPED_TRACE(cat(arch_name(sc.arch), " every ", sc.every, " of ", sc.layers, " from ", sc.from));
    ModelConfig cfg = tiny_config(sc.arch, sc.tied);
    cfg.num_hidden_layers = sc.layers;
    EngineConfig ec;
    ec.n_slots = 2;
    ec.max_chunk_tokens = 16;  // micro-batches in several chunks
    ec.max_chunks = 8;
    ec.activations_on_device = sc.acts_on_device;
    ec.speculation = sc.speculative ? EngineConfig::Speculation::always : EngineConfig::Speculation::off;
    EngineConfig sparse = ec;
    sparse.checkpoint_every = sc.every;
    sparse.strided_from = sc.from;
    // The window stores only the saved inputs: from `from` up every every-th.
    int stored = 0, expected = 0;
    for (const BufferSpec& b : window_buffer_specs(cfg, sparse, DType::f32)) stored += b.role == BufferRole::act_store;
    for (int k = 0; k < sc.layers; ++k) expected += k < sc.from || (k - sc.from) % sc.every == 0;
    EXPECT_EQ(stored, expected);
    EXPECT_LT(stored, sc.layers);
    HostBackend be_a;
    LazyStreams lazy;
    SlidingWindowExecutor all(be_a, cfg, ec), replaying(lazy.be, cfg, sparse);
    same_start(cfg, all, replaying, 7);
    OptimHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = sc.clip;
    for (int step = 0; step < 3; ++step) {
      std::vector<Batch> micro;
      for (int m = 0; m < sc.accum; ++m) micro.push_back(random_batch(cfg, 2, 12, uint64_t(10 * step + m)));
      const StepStats a = all.train_step(micro, h), b = replaying.train_step(micro, h);
      EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    }
    expect_same_state(all, replaying, true);
    EXPECT_EQ(lazy.be.ops_run_unforced(), 0u);
  }
}

TEST(Schedule, EveryComputeHasItsWeightsAndInputs) {
  for (int slots : {2, 3}) {
    for (int chunks : {1, 3}) {
      StepShape sh{5, chunks, slots, Pass::train};
      auto ops = build_step_schedule(sh);
      std::vector<int> slot_layer(size_t(slots), -1);
      std::vector<int> fwd(5, 0), bwd(5, 0);
      std::set<std::pair<int, int>> fetched, offloaded;
      int loads = 0;
      for (auto& op : ops) {
        switch (op.kind) {
          case OpKind::load_weights:
            if (op.slot >= 0) {
              slot_layer[size_t(op.slot)] = op.layer;
              ++loads;
            }
            break;
          case OpKind::layer_forward:
            ASSERT_EQ(slot_layer[size_t(op.slot)], op.layer) << describe(op);
            // Its input's copy to the store is enqueued first, so that it overlaps the layer.
            ASSERT_TRUE(offloaded.count({op.layer, op.chunk})) << describe(op);
            ++fwd[size_t(op.layer)];
            break;
          case OpKind::offload_input: offloaded.insert({op.layer, op.chunk}); break;
          case OpKind::fetch_input:
            ASSERT_TRUE(offloaded.count({op.layer, op.chunk})) << describe(op);
            fetched.insert({op.layer, op.chunk});
            break;
          case OpKind::layer_backward:
            ASSERT_EQ(slot_layer[size_t(op.slot)], op.layer) << describe(op);
            ASSERT_TRUE(fetched.count({op.layer, op.chunk})) << describe(op);
            ++bwd[size_t(op.layer)];
            break;
          default: break;
        }
      }
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(fwd[size_t(k)], chunks);
        EXPECT_EQ(bwd[size_t(k)], chunks);
      }
      // 5 forward loads; backward reloads all but the `slots` layers still resident.
      EXPECT_EQ(loads, 5 + 5 - slots);
    }
  }
}

TEST(Schedule, EvaluationHasNoBackward) {
  auto ops = build_step_schedule({4, 2, 2, Pass::evaluate});
  for (auto& op : ops) {
    EXPECT_NE(op.kind, OpKind::layer_backward);
    EXPECT_NE(op.kind, OpKind::offload_input);
  }
  EXPECT_EQ(ops.back().kind, OpKind::head);
}

}  // namespace

namespace {

// The device-resident executor (state and AdamW on the backend) against the host-AdamW
// resident step, on the host backend: the same AdamW arithmetic; the norm is reduced in f32
// on the backend instead of double on the host, so the clip coefficient may differ by an ulp.
TEST(DeviceResident, MatchesHostAdamWStep) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config(Arch::qwen3, tied);
    HostBackend be_a;
    LazyStreams lazy_b;
    ResidentExecutor a(be_a, cfg, 64);
    DeviceResidentExecutor b(lazy_b.be, cfg, 64);
    same_start(cfg, a, b, 9);
    OptimHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = 0.5f;
    for (int step = 0; step < 3; ++step) {
      std::vector<Batch> micro = {random_batch(cfg, 2, 12, uint64_t(step))};
      StepStats x = a.train_step(micro, h), y = b.train_step(micro, h);
      EXPECT_NEAR(y.loss(), x.loss(), 1e-5 * x.loss());
      EXPECT_NEAR(y.grad_norm, x.grad_norm, 1e-5 * x.grad_norm);
    }
    double max_diff = 0;
    ParamStore& pa = a.params();
    ParamStore& pb = b.params();
    EXPECT_EQ(pb.step, 3);
    for (int u = 0; u < pa.n_units(); ++u)
      for (int64_t i = 0; i < pa.numel(u); ++i) {
        max_diff = std::max(max_diff, double(std::fabs(pa.master(u)[i] - pb.master(u)[i])));
        ASSERT_EQ(pa.m(u)[i] == 0, pb.m(u)[i] == 0);  // same elements touched (no padding)
      }
    EXPECT_LE(max_diff, 3 * 1e-3 * h.lr);
    EXPECT_EQ(lazy_b.be.ops_run_unforced(), 0u);
  }
}

}  // namespace

namespace {

// The engine with some of its orderings left out, to show that the lazy streams catch the
// omission: a decorator over the lazy backend whose events drop the waits (or the host's
// synchronizes) that `pick(producer, consumer)` selects, by stream name ("host" for a
// synchronize; the producer is the stream of the event's latest record). Everything else
// goes to the lazy backend unchanged.
class ForgetfulBackend final : public PassThroughBackend {
 public:
  using Pick = std::function<bool(const std::string& producer, const std::string& consumer)>;
  ForgetfulBackend(Backend& in, Pick pick) : PassThroughBackend(in), pick_(std::move(pick)) {}
  std::string name() const override { return in_.name() + " (forgetful)"; }
  std::unique_ptr<Stream> create_stream(const std::string& n) override {
    auto s = in_.create_stream(n);
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->names[s.get()] = n;
    return s;
  }
  std::unique_ptr<Event> create_event() override {
    return std::make_unique<ForgetfulEvent>(in_.create_event(), st_, pick_);
  }
  int forgotten() const { return st_->forgotten; }  // waits and synchronizes dropped so far

 private:
  struct State {
    std::mutex mu;
    std::map<const Stream*, std::string> names;
    std::atomic<int> forgotten{0};
    std::string name(const Stream& s) {
      std::lock_guard<std::mutex> lk(mu);
      auto it = names.find(&s);
      return it == names.end() ? "default" : it->second;
    }
  };
  class ForgetfulEvent final : public Event {
   public:
    ForgetfulEvent(std::unique_ptr<Event> e, std::shared_ptr<State> st, Pick pick)
        : e_(std::move(e)), st_(std::move(st)), pick_(std::move(pick)) {}
    void record(Stream& s) override {
      {
        std::lock_guard<std::mutex> lk(mu_);
        producer_ = st_->name(s);
      }
      e_->record(s);
    }
    void wait(Stream& s) override {
      if (!forget(st_->name(s))) e_->wait(s);
    }
    void synchronize() override {
      if (!forget("host")) e_->synchronize();
    }
    bool query() override { return e_->query(); }

   private:
    bool forget(const std::string& consumer) {
      std::string p;
      {
        std::lock_guard<std::mutex> lk(mu_);
        p = producer_;
      }
      if (p.empty() || !pick_(p, consumer)) return false;
      ++st_->forgotten;
      return true;
    }
    std::unique_ptr<Event> e_;
    std::shared_ptr<State> st_;
    Pick pick_;
    std::mutex mu_;
    std::string producer_;
  };

  Pick pick_;
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

struct Forgetting {
  bool differs = false;  // losses, norms or weights not the reference's
  std::string error;     // what the engine threw, if it did
  int forgotten = 0;
  uint64_t unforced = 0;
};

// Three clipped steps of the small window (layer 1's AdamW on the device) on the lazy
// backend behind a ForgetfulBackend, against the resident reference.
Forgetting train_forgetting(bool speculative, ForgetfulBackend::Pick pick) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  const int rows = 2, seq = 12;
  HostBackend be_ref;
  ResidentExecutor ref(be_ref, cfg, rows * (seq + 2));
  LazyStreams lazy;
  ForgetfulBackend be(lazy.be, std::move(pick));
  EngineConfig ec = small_window(64, 2, speculative);
  ec.device_adamw_layers = 1;
  EngineTestModes test;
  test.speculate_everything = speculative;
  Forgetting f;
  try {
    SlidingWindowExecutor eng(be, cfg, ec, test);
    same_start(cfg, ref, eng, 42);
    OptimHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = 0.05f;
    for (int step = 0; step < 3; ++step) {
      std::vector<Batch> micro = {random_batch(cfg, rows, seq, uint64_t(100 * step))};
      StepStats a = ref.train_step(micro, h), b = eng.train_step(micro, h);
      // The tolerances of SlidingVsResident (fp32 summation order, a clipped step's ulp);
      // written as !(x <= tol) so that a NaN counts as a difference.
      f.differs |= !(std::fabs(b.loss() - a.loss()) <= 1e-5 * a.loss()) ||
                   !(std::fabs(b.grad_norm - a.grad_norm) <= 1e-5 * a.grad_norm);
    }
    for (int u = 0; u < ref.params().n_units(); ++u)
      for (int64_t i = 0; i < ref.params().numel(u); ++i)
        f.differs |= !(std::fabs(ref.params().master(u)[i] - eng.params().master(u)[i]) <= 3 * 1e-3 * h.lr);
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  f.forgotten = be.forgotten();
  f.unforced = lazy.be.ops_run_unforced();
  return f;
}

// The negative test of the lazy streams: an engine that omits a stream wait (the activation
// offload not waiting for the layer that writes it) or a host synchronize (reading what the
// update streams brought home before it is there) gives wrong results on them, on every run
// and whatever the load, without hanging; with nothing omitted the same harness matches.
// ops_run_unforced stays 0: the omission shows by itself, nothing ran because time passed.
TEST(SlidingWindow, LazyStreamsCatchAnOmittedWaitOrSynchronize) {
  for (bool speculative : {false, true}) {
    SCOPED_TRACE(speculative ? "speculative" : "deferred");
    Forgetting none = train_forgetting(speculative, [](const std::string&, const std::string&) { return false; });
    EXPECT_EQ(none.error, "");
    EXPECT_FALSE(none.differs) << "the harness itself must match the reference";
    EXPECT_EQ(none.forgotten, 0);
    EXPECT_EQ(none.unforced, 0u);

    Forgetting wait = train_forgetting(speculative, [](const std::string& p, const std::string& c) {
      return p == "compute" && c == "d2h";
    });
    EXPECT_GT(wait.forgotten, 0) << "the engine no longer orders d2h after compute: pick another wait";
    EXPECT_TRUE(wait.differs || !wait.error.empty()) << "an omitted wait went unnoticed";
    EXPECT_EQ(wait.unforced, 0u);

    Forgetting sync = train_forgetting(speculative, [](const std::string& p, const std::string& c) {
      return p == "update d2h" && c == "host";
    });
    EXPECT_GT(sync.forgotten, 0) << "the host no longer synchronizes on update d2h: pick another";
    EXPECT_TRUE(sync.differs || !sync.error.empty()) << "an omitted synchronize went unnoticed";
    EXPECT_EQ(sync.unforced, 0u);
  }
}

}  // namespace

namespace {

// Which of 5 layers save their input: all; every 2nd (a one-layer segment at the top); every
// 3rd; after one kept-attention layer, every 2nd (EngineConfig::saves_input).
std::vector<std::vector<char>> saved_input_patterns() {
  return {{}, {1, 0, 1, 0, 1}, {1, 0, 0, 1, 0}, {1, 1, 0, 1, 0}};
}

// The shapes the executor builds: resident homes and device-AdamW layers among them.
std::vector<StepShape> checked_shapes() {
  std::vector<StepShape> v;
  for (int slots : {2, 3})
    for (int chunks : {1, 3})
      for (int home : {0, 1, 2})  // none, the last two layers + head, device-AdamW layers 0-1
        for (const std::vector<char>& saved : saved_input_patterns()) {
          StepShape sh{5, chunks, slots, Pass::train};
          sh.weights_on_device.assign(7, 0);
          sh.device_adamw.assign(7, 0);
          sh.saved_input = saved;
          if (home == 1) sh.weights_on_device[4] = sh.weights_on_device[5] = sh.weights_on_device[6] = 1;
          if (home == 2) sh.weights_on_device[1] = sh.weights_on_device[2] = sh.device_adamw[1] = sh.device_adamw[2] = 1;
          v.push_back(sh);
          sh.pass = Pass::evaluate;
          v.push_back(sh);
        }
  return v;
}

TEST(Schedule, BuiltSchedulesPassTheProducerConsumerCheck) {
  for (const StepShape& sh : checked_shapes()) {
    const std::vector<Op> ops = build_step_schedule(sh);
    EXPECT_EQ(check_schedule(sh, ops), "") << sh.n_slots << " slots, " << sh.n_chunks << " chunks";
    // An unsaved layer's input is replayed once per chunk, and no layer's weights load more
    // than once in the backward (the replay of a segment's first layer keeps its slot for
    // its backward).
    int replays = 0, unsaved = 0, bwd_loads = 0;
    bool in_backward = false;
    for (const Op& op : ops) {
      replays += op.kind == OpKind::replay_forward;
      in_backward |= op.kind == OpKind::fetch_input;
      bwd_loads += in_backward && op.kind == OpKind::load_weights && op.unit <= sh.n_layers;
    }
    for (int k = 0; k < sh.n_layers; ++k) unsaved += !sh.saves_input(k);
    if (!sh.backward()) continue;
    EXPECT_EQ(replays, unsaved * sh.n_chunks);
    EXPECT_LE(bwd_loads, sh.n_layers - 1);
    // A training step ends with every unit's update, device-AdamW layers first.
    if (!sh.backward()) continue;
    std::vector<int> order;
    for (const Op& op : ops)
      if (op.kind == OpKind::update) order.push_back(op.unit);
    ASSERT_EQ(order.size(), 7u);
    if (sh.device_adamw[1]) {
      EXPECT_EQ(order[0], 1);
    }
    EXPECT_EQ(order.back(), 6);  // the head last: the round's end is keyed on it
  }
}

// Each kind of broken list is caught, with the op named.
TEST(Schedule, CheckCatchesBrokenSchedules) {
  const StepShape sh{4, 2, 2, Pass::train};
  const std::vector<Op> good = build_step_schedule(sh);
  auto first = [&](OpKind k, int layer = -1) {
    for (size_t i = 0; i < good.size(); ++i)
      if (good[i].kind == k && (layer < 0 || good[i].layer == layer)) return i;
    return good.size();
  };
  auto broken = [&](auto edit) {
    std::vector<Op> ops = good;
    edit(ops);
    return check_schedule(sh, ops);
  };
  // Dropping an update wait, a load, an offload; a fetch into the wrong buffer; a layer
  // backward before the one above it; an update before its gradient left; two updates.
  EXPECT_NE(broken([&](auto& o) { o.erase(o.begin() + long(first(OpKind::wait_update))); }), "");
  EXPECT_NE(broken([&](auto& o) { o.erase(o.begin() + long(first(OpKind::load_weights))); }), "");
  EXPECT_NE(broken([&](auto& o) { o.erase(o.begin() + long(first(OpKind::offload_input, 2))); }), "");
  EXPECT_NE(broken([&](auto& o) { o[first(OpKind::fetch_input)].buf ^= 1; }), "");
  EXPECT_NE(broken([&](auto& o) {
              const size_t a = first(OpKind::layer_backward, 3), b = first(OpKind::layer_backward, 2);
              std::swap(o[a], o[b]);
            }), "");
  EXPECT_NE(broken([&](auto& o) {
              const size_t u = first(OpKind::update), g = first(OpKind::grads_out);
              Op op = o[u];
              op.unit = 4;
              o.insert(o.begin() + long(g), op);  // before the head's gradient left
            }), "");
  EXPECT_NE(broken([&](auto& o) { o.push_back(o.back()); }), "");
  EXPECT_NE(broken([&](auto& o) { o[first(OpKind::load_weights)].kind = OpKind::home_weights; }), "");
  const std::string msg = broken([&](auto& o) { o.erase(o.begin() + long(first(OpKind::offload_input, 2))); });
  EXPECT_NE(msg.find("layer=2"), std::string::npos) << msg;
}

// The same for the replays of a step that saves every 2nd layer's input: a replay dropped, an
// unsaved layer reading a fetch buffer, a replay into the buffer the backward still reads, an
// offload of an unsaved layer, and a replay after the backward it feeds.
TEST(Schedule, CheckCatchesBrokenReplays) {
  StepShape sh{5, 2, 2, Pass::train};
  sh.saved_input = {1, 0, 1, 0, 1};
  const std::vector<Op> good = build_step_schedule(sh);
  ASSERT_EQ(check_schedule(sh, good), "");
  auto first = [&](OpKind k, int layer) {
    for (size_t i = 0; i < good.size(); ++i)
      if (good[i].kind == k && good[i].layer == layer) return i;
    ADD_FAILURE() << "no " << op_kind_name(k) << " of layer " << layer;
    return size_t(0);
  };
  auto broken = [&](auto edit) {
    std::vector<Op> ops = good;
    edit(ops);
    return check_schedule(sh, ops);
  };
  EXPECT_NE(broken([&](auto& o) { o.erase(o.begin() + long(first(OpKind::replay_forward, 2))); }), "");
  EXPECT_NE(broken([&](auto& o) { o[first(OpKind::layer_backward, 3)].buf = 0; }), "");
  EXPECT_NE(broken([&](auto& o) { o[first(OpKind::replay_forward, 0)].act = 1; }), "");
  EXPECT_NE(broken([&](auto& o) {
              Op off{OpKind::offload_input, 4, 3, 0};
              o.insert(o.begin() + long(first(OpKind::layer_forward, 3)), off);
            }), "");
  EXPECT_NE(broken([&](auto& o) {
              const size_t r = first(OpKind::replay_forward, 2), b = first(OpKind::layer_backward, 3);
              Op op = o[r];
              o.erase(o.begin() + long(r));
              o.insert(o.begin() + long(b), op);  // b moved up by one: after layer 3's first backward
            }), "");
}

}  // namespace
