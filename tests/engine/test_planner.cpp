// The planner counts what the executors allocate, picks resident when everything fits, a
// window otherwise, and refuses a budget that is too small before allocating anything.
#include <gtest/gtest.h>

#include "backend/forwarding_backend.h"
#include "backend/host/host_backend.h"
#include "engine/executor_factory.h"
#include "engine/planner.h"
#include "engine/resident_executor.h"
#include "engine/sliding_executor.h"
#include "engine/window_buffers.h"
#include "model/model_init.h"
#include "model/model_presets.h"

using namespace sf;

namespace {

size_t sum_device(const std::vector<MemoryLine>& lines) {
  size_t n = 0;
  for (auto& l : lines) n += l.device ? l.bytes : 0;
  return n;
}

// Records every allocation (name, bytes, tier) and forwards everything to the host backend.
class RecordingBackend final : public PassThroughBackend {
 public:
  struct Alloc {
    std::string what;
    size_t bytes;
    Tier tier;
  };
  explicit RecordingBackend(Backend& inner) : PassThroughBackend(inner) {}
  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override {
    allocs.push_back({what, bytes, Tier::device});
    return in_.alloc(bytes, what);
  }
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override {
    allocs.push_back({what, bytes, Tier::host});
    return in_.alloc_host(bytes, what);
  }
  std::vector<Alloc> allocs;
};

// The executor allocates exactly the buffer list the planner sums, buffer by buffer and to
// the byte, and the plan's lines add up to that list (tier-rounded) plus the state and the
// backend's workspaces.
TEST(Planner, SlidingExecutorAllocatesExactlyThePlannedBuffers) {
  for (bool tied : {false, true})
    for (int resident : {0, 1, 2})
      for (int dev_adamw : {0, 1, 3})  // device-AdamW layers: their state, accumulators, homes
        for (bool spec : {false, true})
          for (int variant : {0, 1, 2, 3}) {  // 1: one gradient buffer; 2: from the master; 3: both
          const bool single = variant % 2 == 1, master = variant >= 2;
          if ((single || master) && dev_adamw > 0) continue;
          if (master && (resident > 0 || spec)) continue;
          ModelConfig cfg = tiny_config(Arch::qwen3, tied);
          cfg.num_hidden_layers = 4;
          // Kept attention: none, the first 2 layers' on the device, all 4 on the host.
          const int kept = (resident + variant + int(spec)) % 3;
          SCOPED_TRACE(cat("tied ", tied, ", resident ", resident, ", device AdamW layers ", dev_adamw,
                           ", speculative ", spec, ", one gradient buffer ", single, ", from the master ", master,
                           ", kept attention ", kept));
          EngineConfig ec;
          ec.max_chunk_tokens = 40;
          ec.max_chunks = 3;
          ec.device_act_layers = 2;  // both tiers of the activation store
          ec.resident_layers = resident;
          ec.device_adamw_layers = dev_adamw;
          ec.head_resident = resident > 0;
          if (spec) ec.speculation = EngineConfig::Speculation::always;
          if (single) ec.layer_grad_buffers = 1;
          if (master) ec.host_weights = EngineConfig::HostWeights::master;
          ec.kept_attention_layers = kept == 0 ? 0 : kept == 1 ? 2 : 4;
          ec.kept_attention_on_device = kept == 1;
          HostBackend host;
          RecordingBackend be(host);
          { SlidingWindowExecutor ex(be, cfg, ec); }
          const std::vector<BufferSpec> specs = window_buffer_specs(cfg, ec, DType::f32);
          ASSERT_EQ(be.allocs.size(), specs.size());
          size_t dev = 0, host_bytes = 0;
          for (size_t i = 0; i < specs.size(); ++i) {
            EXPECT_EQ(be.allocs[i].what, specs[i].what);
            EXPECT_EQ(be.allocs[i].bytes, specs[i].bytes) << specs[i].what;
            EXPECT_EQ(be.allocs[i].tier, specs[i].tier) << specs[i].what;
            (specs[i].tier == Tier::device ? dev : host_bytes) += tier_bytes(specs[i]);
          }
          size_t planned_dev = 0, planned_host = 0, state = 0, workspaces = 0;
          for (const MemoryLine& l : sliding_memory(cfg, ec, DType::f32)) {
            (l.device ? planned_dev : planned_host) += l.bytes;
            if (l.what == "fp32 master + AdamW m, v") state = l.bytes;
            if (l.what == "backend workspaces") workspaces = l.bytes;
          }
          EXPECT_EQ(planned_dev, dev + workspaces);
          EXPECT_EQ(planned_host, host_bytes + state);
          EXPECT_EQ(state, size_t(ModelLayout::build(cfg).total_numel()) * 12);
          EXPECT_EQ(host.bytes_in_use(), 0u);
        }
}

// Each state format: the window's buffers (a bf16 master's f32 mirrors for the host
// backend's f32 compute) and the state line are what the executor and its ParamStore
// allocate, to the byte; int8 moments with an fp32 master stay within 6.1 B/param, with a
// bf16 master within 4.1 (issue 18), counted on the 8B shape.
TEST(Planner, CompactStatesAreCountedAsAllocated) {
  const StateFormat formats[] = {{MomentFormat::f32, MasterFormat::f32},
                                 {MomentFormat::bf16, MasterFormat::f32},
                                 {MomentFormat::int8, MasterFormat::f32},
                                 {MomentFormat::int8, MasterFormat::bf16},
                                 {MomentFormat::bf16, MasterFormat::bf16}};
  for (const StateFormat& f : formats)
    for (bool master : {false, true}) {
      ModelConfig cfg = tiny_config(Arch::qwen2, false);
      SCOPED_TRACE(cat(state_format_words(f), master ? ", from the master" : ""));
      EngineConfig ec;
      ec.max_chunk_tokens = 40;
      ec.max_chunks = 2;
      ec.state_format = f;
      if (master) ec.host_weights = EngineConfig::HostWeights::master;
      HostBackend host;
      RecordingBackend be(host);
      SlidingWindowExecutor ex(be, cfg, ec);
      size_t allocated = 0;
      for (const auto& a : be.allocs) {
        const size_t g = a.tier == Tier::device ? 256 : 64;  // window_buffers' tier_bytes
        allocated += (std::max<size_t>(a.bytes, 1) + g - 1) / g * g;
      }
      size_t planned = 0, state = 0, workspaces = 0;
      for (const MemoryLine& l : sliding_memory(cfg, ec, DType::f32)) {
        if (!l.process) planned += l.bytes;  // the runtime's and a transient scratch: not allocations
        if (l.what.find("AdamW m, v") != std::string::npos) state = l.bytes;
        if (l.what == "backend workspaces") workspaces = l.bytes;
      }
      EXPECT_EQ(state, ex.params().host_bytes());
      EXPECT_EQ(planned, allocated + state + workspaces);
      size_t mirrors = 0;
      for (const auto& a : be.allocs) mirrors += a.what.find("f32 weights of unit") == 0;
      EXPECT_EQ(mirrors, f.master == MasterFormat::bf16 ? size_t(ex.params().n_units()) : 0u);
    }
  const ModelConfig big = model_preset("llama3-8b");
  EXPECT_NEAR(state_bytes_per_param(big, {}), 12.0, 0.01);
  EXPECT_LE(state_bytes_per_param(big, {MomentFormat::int8, MasterFormat::f32}), 6.1);
  EXPECT_LE(state_bytes_per_param(big, {MomentFormat::int8, MasterFormat::bf16}), 4.1);
}

// A run whose fp32 state does not fit says which compact state would (8B in 64 GiB of RAM),
// and the plan names the format it assumes.
TEST(Planner, AnFp32RefusalNamesTheCompactStateThatFits) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(64) << 30, false};
  StepRequest req{32 * 1024, 1, 1024};
  Plan fp32 = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
  ASSERT_FALSE(fp32.fits);
  EXPECT_NE(fp32.advice.find("--optimizer-state int8"), std::string::npos) << fp32.advice;
  req.state_format = {MomentFormat::int8, MasterFormat::f32};
  Plan int8 = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(int8.fits) << int8.advice;
  EXPECT_EQ(int8.engine.state_format, req.state_format);
  // A compact state has no exact undo: it speculates only the weights of streamed layers
  // (the state untouched until the step is kept; HostUpdater), never the embedding's.
  const EngineConfig& e = int8.engine;
  const int L = cfg.num_hidden_layers, n_units = L + 2;
  ASSERT_TRUE(e.speculative());
  EXPECT_FALSE(e.has_next(0, n_units));
  EXPECT_FALSE(e.has_next(n_units - 1, n_units));
  EXPECT_TRUE(e.has_next(e.device_adamw_layers + 1, n_units)) << "the first streamed host-AdamW layer";
  if (e.resident_layers > 0) {
    EXPECT_TRUE(e.next_units >= 0 || e.has_next(L - e.resident_layers, n_units));
    EXPECT_FALSE(e.has_next(L - e.resident_layers + 1, n_units)) << "a resident layer's home is the device's";
  }
  // Not with the moments on disk (phase A and the commit would each read them).
  Budget small{size_t(24) << 30, size_t(44) << 30, false};
  small.moments_dir = ::testing::TempDir();
  small.moments_dir_free = size_t(1) << 40;
  Plan disk = make_plan(cfg, req, small, DType::bf16, HardwareModel{});
  ASSERT_TRUE(disk.fits) << disk.advice;
  ASSERT_FALSE(disk.engine.moments_dir.empty());
  EXPECT_FALSE(disk.engine.speculative());
  const std::string d = describe_plan(cfg, req, b, int8);
  EXPECT_NE(d.find("state      fp32 master, int8 AdamW moments (6.03 B/param)"), std::string::npos) << d;
  EXPECT_NE(d.find("fp32 master + int8 AdamW m, v"), std::string::npos) << d;
}

// Over a sweep of budgets, with and without clipping: more memory never predicts a slower
// step (nor refuses what a smaller budget took), and every plan's windows allocate exactly
// what it counted. On the host backend (one pool) and for a GPU (device and host apart).
// Then the long-sequence sweep where kept attention is searched: a window only (45M-parameter
// shape, a 1K vocabulary so that the layers decide what fits, attention at a fifth of the
// GEMM rate: its share of the compute is far above kKeptAttentionMinShare); its plans keep
// the attention on the host, then on the device as the device budget grows.
struct SweepCounts {
  int plans = 0, kept_on_device = 0, kept_on_host = 0;
};

// make_plan over budgets of the axis (host or device; the other 64 GiB) from lo to hi MiB;
// each step at most `slack` (relative) slower than the one before.
SweepCounts expect_monotone_sweep(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw, DType cd,
                                  bool host_axis, size_t lo, size_t hi, bool allow_resident = true,
                                  double slack = 1e-7) {
  const bool unified = cd == DType::f32;
  SweepCounts n;
  double prev = 0;
  bool prev_fit = false;
  for (size_t mib = lo; mib <= hi; mib += 16) {
    Budget b{size_t(64) << 30, size_t(64) << 30, unified};
    // A GPU plan's host also holds the CUDA runtime: the sweep starts beside it.
    const size_t runtime = host_axis && !unified ? kCudaRuntimeHostBytes : 0;
    (host_axis ? b.host_bytes : b.device_bytes) = runtime + (mib << 20);
    const Plan p = make_plan(cfg, req, b, cd, hw, allow_resident);
    SCOPED_TRACE(cat("clipping ", req.clipping, ", ", dtype_name(cd), ", ", host_axis ? "host " : "device ", mib,
                     " MiB"));
    EXPECT_TRUE(p.fits || !prev_fit) << "refused what a smaller budget took: " << p.advice;
    if (p.fits && prev_fit) {
      EXPECT_LE(p.step_seconds, prev * (1 + slack));
    }
    if (p.fits) {
      EXPECT_LE(host_axis ? p.host_bytes + (unified ? p.device_bytes : 0) : p.device_bytes,
                (host_axis ? b.host_bytes : b.device_bytes));
      EXPECT_TRUE(!p.engine.from_master() || !req.clipping) << "a clipping run planned without its norm";
      ++n.plans;
      if (p.mode == Plan::Mode::sliding && p.engine.kept_attention_layers > 0)
        ++(p.engine.kept_attention_on_device ? n.kept_on_device : n.kept_on_host);
      prev = p.step_seconds;
    }
    prev_fit = p.fits;
  }
  EXPECT_TRUE(prev_fit);
  return n;
}

TEST(Planner, MoreMemoryNeverPredictsASlowerStep) {
  ModelConfig cfg = model_preset("tiny");
  const StepRequest base{4 * 256, 2, 256};
  HardwareModel hw;
  hw.device_flops = 50e9;  // fixed figures: no measuring in a test
  hw.adamw_params_per_s = 0.3e9;
  for (bool clipping : {true, false}) {
    StepRequest req = base;
    req.clipping = clipping;
    for (DType cd : {DType::f32, DType::bf16}) {
      const bool unified = cd == DType::f32;
      const Plan big = make_plan(cfg, req, Budget{size_t(64) << 30, size_t(64) << 30, unified}, cd, hw);
      ASSERT_TRUE(big.fits);
      // Host sweep (device fixed and ample), then device sweep (host fixed and ample).
      expect_monotone_sweep(cfg, req, hw, cd, true, 32, 2048);
      if (!unified) expect_monotone_sweep(cfg, req, hw, cd, false, 32, 2048);
    }
  }
  ModelConfig small = model_preset("small");
  small.vocab_size = 1024;
  HardwareModel slow_attention = hw;
  slow_attention.attention_flops = 10e9;
  // Slack: the planner's tie rule (beats(): steps within 0.5% go to less GPU work, then less
  // host memory) lets a plan 1e-6 slower win here (one layer gradient buffer and a resident
  // home for less host memory); the attention kept or not is a 17% difference.
  const SweepCounts n = expect_monotone_sweep(small, StepRequest{2 * 2048, 1, 2048}, slow_attention, DType::bf16,
                                              false, 128, 512, false, 0.005);
  EXPECT_GT(n.kept_on_host, 0) << "no plan of the sweep kept the attention on the host";
  EXPECT_GT(n.kept_on_device, 0) << "no plan of the sweep kept the attention on the device";
  EXPECT_LT(n.kept_on_device + n.kept_on_host, n.plans) << "the smallest windows have no room for it";
}

// Builds p's window on the host backend: it allocates exactly what p counted (the host
// backend's tiers; the planner's lines add up to the list plus state and workspaces).
void expect_allocates_what_it_counts(const ModelConfig& cfg, const Plan& p) {
  HostBackend host;
  RecordingBackend be(host);
  { SlidingWindowExecutor ex(be, cfg, p.engine); }
  size_t allocated = 0;
  for (const auto& a : be.allocs) {
    const size_t g = a.tier == Tier::device ? 256 : 64;  // window_buffers' tier_bytes
    allocated += (std::max<size_t>(a.bytes, 1) + g - 1) / g * g;
  }
  size_t state = 0, workspaces = 0;
  for (const MemoryLine& l : p.lines) {
    if (l.what == "fp32 master + AdamW m, v") state = l.bytes;
    if (l.what == "backend workspaces") workspaces = l.bytes;
  }
  EXPECT_EQ(p.device_bytes + p.host_bytes, allocated + state + workspaces);
}

// The plans the sweep picks, built, each distinct window once; then windows that keep the
// attention (the long-sequence shape of the sweep above, in one pool).
TEST(Planner, PlannedWindowsAllocateWhatTheyCount) {
  ModelConfig cfg = model_preset("tiny");
  StepRequest req{4 * 256, 1, 256};
  req.clipping = false;
  HardwareModel hw;
  hw.device_flops = 50e9;
  hw.adamw_params_per_s = 0.3e9;
  cfg.vocab_size = 1024;  // the layers, not the table, decide what fits
  int master_plans = 0, built = 0;
  std::string last;
  for (size_t mib = 16; mib <= 1024 && built < 8; mib += 2) {
    const Plan p = make_plan(cfg, req, Budget{mib << 20, mib << 20, true}, DType::f32, hw, false);
    const std::string mode = describe_plan(cfg, req, Budget{mib << 20, mib << 20, true}, p, true);
    if (!p.fits || mode.substr(0, mode.find('\n')) == last) continue;  // each distinct window once
    last = mode.substr(0, mode.find('\n'));
    SCOPED_TRACE(cat(mib, " MiB: ", last));
    ++built;
    master_plans += p.engine.from_master();
    expect_allocates_what_it_counts(cfg, p);
  }
  EXPECT_GE(built, 3);
  EXPECT_GT(master_plans, 0) << "the smallest budgets stream from the master";

  ModelConfig small = model_preset("small");
  small.vocab_size = 1024;
  hw.attention_flops = 10e9;
  const StepRequest long_req{2 * 2048, 1, 2048};
  int kept_built = 0;
  for (size_t mib = 400; mib <= 1024 && kept_built < 2; mib += 32) {
    const Budget b{mib << 20, mib << 20, true};
    const Plan p = make_plan(small, long_req, b, DType::f32, hw, false);
    if (!p.fits || p.engine.kept_attention_layers == 0) continue;
    SCOPED_TRACE(cat(mib, " MiB: ", describe_plan(small, long_req, b, p, true)));
    ++kept_built;
    expect_allocates_what_it_counts(small, p);
  }
  EXPECT_GT(kept_built, 0) << "no window of these budgets kept the attention";
}

// The resident executors keep every layer's activations when the plan says so, and allocate
// no more than resident_memory() counts, either way.
TEST(Planner, ResidentExecutorAllocatesNoMoreThanPlanned) {
  ModelConfig cfg = tiny_config(Arch::qwen2, false);
  for (bool keep : {false, true})
    for (int64_t rows : {256, 64}) {  // LM-head chunk: the default, and a chosen one
      HostBackend be;
      {
        ResidentExecutor ex(be, cfg, 96, keep, rows);
        size_t planned = sum_device(resident_memory(cfg, 96, DType::f32, keep, rows));
        EXPECT_LE(be.peak_bytes_in_use(), planned) << "keep " << keep << " rows " << rows;
        EXPECT_GE(be.peak_bytes_in_use() + (size_t(41) << 20), planned) << "keep " << keep;
      }
      EXPECT_EQ(be.bytes_in_use(), 0u);
    }
}

// Kept activations when the budget holds them (no recompute: a faster predicted step),
// recompute when only the plain resident state fits.
TEST(Planner, ResidentKeepsActivationsWhenTheyFit) {
  ModelConfig cfg = model_preset("qwen3-0.6b");
  const StepRequest req{8 * 1024, 1, 1024};
  Plan roomy = make_plan(cfg, req, Budget{size_t(120) << 30, size_t(64) << 30, false}, DType::bf16,
                         HardwareModel{});
  ASSERT_EQ(roomy.mode, Plan::Mode::resident);
  EXPECT_TRUE(roomy.keep_activations);
  const size_t keep_bytes = roomy.device_bytes;
  Plan tight = make_plan(cfg, req, Budget{keep_bytes - (size_t(1) << 30), size_t(64) << 30, false},
                         DType::bf16, HardwareModel{});
  ASSERT_EQ(tight.mode, Plan::Mode::resident) << tight.advice;
  EXPECT_FALSE(tight.keep_activations);
  EXPECT_LT(tight.device_bytes, keep_bytes);
  EXPECT_GT(roomy.tokens_per_second, tight.tokens_per_second);
}

TEST(Planner, PicksResidentWhenEverythingFits) {
  ModelConfig cfg = model_preset("tiny");
  Budget b{size_t(8) << 30, size_t(8) << 30, false};
  Plan p = make_plan(cfg, {1024, 1, 256}, b, DType::bf16, HardwareModel{});
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.mode, Plan::Mode::resident);
}

TEST(Planner, SlidesWhenTheDeviceIsSmall) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(400) << 30, false};
  Plan p = make_plan(cfg, {8 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  EXPECT_TRUE(p.fits) << p.advice;
  EXPECT_EQ(p.mode, Plan::Mode::sliding);
  EXPECT_LE(p.device_bytes, b.device_bytes);
  EXPECT_GT(p.tokens_per_second, 0);
}

// The LM head runs the largest logits chunks (up to 4096 tokens) that the layer scratch it
// shares holds (its f32 weight-gradient accumulator is then read and written up to 16x less
// often): no extra device memory. At 8B and 32K tokens the layer scratch, its MLP tiled at
// kMlpTileTokens, is 2.44 GiB: it holds 2048-token chunks (1.48 GiB with xn, dxn), not 4096
// (2.46 GiB). The fp32 host reference keeps 256.
TEST(Planner, LargerHeadChunksCostNoDeviceMemory) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(112) << 30, false};
  Plan p = make_plan(cfg, {32 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  ASSERT_EQ(p.mode, Plan::Mode::sliding);
  EXPECT_EQ(p.engine.head_chunk_rows, 2048);
  EngineConfig small = p.engine;
  small.head_chunk_rows = 256;
  EXPECT_EQ(sum_device(sliding_memory(cfg, p.engine, DType::bf16)),
            sum_device(sliding_memory(cfg, small, DType::bf16)));
  EXPECT_EQ(head_chunk_rows_for(cfg, 32 * 1024, DType::f32), 256);
  EXPECT_EQ(head_chunk_rows_for(cfg, 100, DType::bf16), 100);  // never more than the tokens
  // Resident (8 layers, whole GPU): the larger chunk too, counted in its plan.
  cfg.num_hidden_layers = 8;
  Plan r = make_plan(cfg, {32 * 1024, 1, 1024}, {size_t(130) << 30, size_t(112) << 30, false},
                     DType::bf16, HardwareModel{});
  ASSERT_EQ(r.mode, Plan::Mode::resident);
  EXPECT_EQ(r.engine.head_chunk_rows, 2048);
}

// A GPU plan's optimizer time comes from this machine's measured CPU AdamW rate.
// Every state format's sweep runs in place (the weights over the gradient, as in training).
TEST(Planner, DeviceModelMeasuresTheHostAdamW) {
  for (StateFormat f : {StateFormat{}, StateFormat{MomentFormat::int8, MasterFormat::f32},
                        StateFormat{MomentFormat::bf16, MasterFormat::bf16}}) {
    SCOPED_TRACE(cat(moment_format_name(f.moments), " moments, ", master_format_name(f.master), " master"));
    const HardwareModel hw = HardwareModel::device_default(f);
    EXPECT_GT(hw.adamw_params_per_s, 1e7);   // any machine: > 10M parameters/s
    EXPECT_LT(hw.adamw_params_per_s, 1e12);  // and not a division by ~0
    EXPECT_EQ(hw.device_flops, HardwareModel{}.device_flops);
  }
}

// Long sequences: neither tier alone holds the saved inputs (108 GiB of host: the state is
// 89.75 GiB, the store 16 GiB, the CUDA runtime 2 GiB); saving every input, the planner
// splits them. (Left to choose, it replays 2 top layers' inputs instead: within 0.5% of the
// split's step, with less GPU work at its larger chunks.)
TEST(Planner, SplitsActivationsBetweenTiers) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(108) << 30, false};
  StepRequest req{8 * 8192, 1, 8192};
  req.checkpoint_every = 1;
  Plan p = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  const int on_device = p.engine.n_device_act_layers(32);
  EXPECT_GT(on_device, 0);
  EXPECT_LT(on_device, 32);
  EXPECT_LE(p.device_bytes, b.device_bytes);
  EXPECT_LE(p.host_bytes, b.host_bytes);
}

TEST(Planner, RefusesTooSmallBudgetsWithAdvice) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(2) << 30, size_t(64) << 30, false};
  Plan p = make_plan(cfg, {8 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.advice.find("host memory"), std::string::npos) << p.advice;
  EXPECT_NE(p.advice.find("device memory"), std::string::npos) << p.advice;
  EXPECT_NE(p.advice.find("--gpu-memory"), std::string::npos) << p.advice;
}

TEST(Planner, MakeExecutorRefusesBeforeAllocating) {
  ModelConfig cfg = model_preset("tiny");
  ExecutorRequest r;
  r.backend = "host";
  r.step = {4 * 64, 1, 64};
  r.host_memory = "1MiB";
  try {
    make_executor(cfg, r);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

TEST(Planner, ParsesSizes) {
  EXPECT_EQ(parse_bytes("24GiB", "--gpu-memory"), size_t(24) << 30);
  EXPECT_EQ(parse_bytes("1.5G", "--gpu-memory"), size_t(3) << 29);
  EXPECT_EQ(parse_bytes("100MB", "--gpu-memory"), size_t(100000000));
  EXPECT_EQ(parse_bytes("4096", "--gpu-memory"), size_t(4096));
  EXPECT_THROW(parse_bytes("lots", "--gpu-memory"), Error);
  EXPECT_THROW(parse_bytes("3 parsecs", "--gpu-memory"), Error);
}


// Layer 0's update is the one the next forward waits for after the backward, and every
// layer's host AdamW is CPU work that bounds small batches: on a GPU the planner moves the
// first layers' optimizer state to the device when the window still fits (8B at 24 GiB:
// layer 0, 2.4 GiB, for a few homes that then stream under the compute). The fp32 host
// reference never does.
TEST(Planner, PutsTheFirstLayersOptimizerOnTheDevice) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(112) << 30, false};
  Plan p = make_plan(cfg, {32 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  EXPECT_GE(p.engine.device_adamw_layers, 1);
  EXPECT_LE(p.device_bytes, b.device_bytes);
  bool listed = false;
  for (auto& l : p.lines) listed |= l.what.find("master + AdamW m, v (") != std::string::npos;
  EXPECT_TRUE(listed);

  // Forced (--device-adamw-layers), e.g. to measure both: 0 spends that memory on the window
  // (more homes, or, since the MLP's scratch is tiled, more of the activation store).
  Plan host = make_plan(cfg, {32 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{}, true, 0);
  ASSERT_TRUE(host.fits);
  EXPECT_EQ(host.engine.device_adamw_layers, 0);
  const int L = int(cfg.num_hidden_layers);
  EXPECT_TRUE(host.engine.resident_layers > p.engine.resident_layers ||
              host.engine.n_device_act_layers(L) > p.engine.n_device_act_layers(L))
      << host.engine.resident_layers << " homes, " << host.engine.n_device_act_layers(L)
      << " device activation layers vs " << p.engine.resident_layers << ", "
      << p.engine.n_device_act_layers(L);
  for (auto& l : host.lines) EXPECT_EQ(l.what.find("master + AdamW m, v ("), std::string::npos);

  // A GPU with room (80 GiB) takes many layers' optimizer off the CPU: batch 8 is bound by
  // the CPU's AdamW (~1.9 s per 8B step on the H200 host) otherwise.
  Budget big{size_t(80) << 30, size_t(112) << 30, false};
  Plan p80 = make_plan(cfg, {8 * 1024, 1, 1024}, big, DType::bf16, HardwareModel{}, false);
  ASSERT_TRUE(p80.fits) << p80.advice;
  EXPECT_GE(p80.engine.device_adamw_layers, 8);
  Plan p80host = make_plan(cfg, {8 * 1024, 1, 1024}, big, DType::bf16, HardwareModel{}, false, 0);
  EXPECT_GT(p80.tokens_per_second, 1.3 * p80host.tokens_per_second);

  ModelConfig tiny = tiny_config(Arch::llama, false);
  Budget hb{size_t(1) << 30, size_t(1) << 30, true};
  Plan h = make_plan(tiny, {64, 1, 32}, hb, DType::f32, HardwareModel{}, false);
  ASSERT_TRUE(h.fits) << h.advice;
  EXPECT_EQ(h.engine.device_adamw_layers, 0);
  EXPECT_THROW(make_plan(tiny, {64, 1, 32}, hb, DType::f32, HardwareModel{}, false, 1), Error);
  EXPECT_THROW(make_plan(cfg, {8 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{}, false, 33), Error);
  // Forced beyond the device budget (32 layers' state is ~75 GiB): refused, naming the flag.
  Plan too_many = make_plan(cfg, {8 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{}, false, 32);
  EXPECT_FALSE(too_many.fits);
  EXPECT_NE(too_many.advice.find("--device-adamw-layers"), std::string::npos) << too_many.advice;
}

// A plan that applies each gradient as it lands names the CPU optimizer when its AdamW
// outlasts the backward (the dev box's 0.6 G params/s against an H200's kernels), and the
// kernels when the CPU keeps up (the H200 host's 4.2 G params/s at 32 x 1024).
TEST(Planner, ALandingPlanNamesTheOptimizerWhenItOutlastsTheBackward) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(11) << 30, size_t(102) << 30, false};
  StepRequest req{32 * 1024, 1, 1024};
  req.clipping = false;
  HardwareModel slow_cpu;
  slow_cpu.adamw_params_per_s = 0.6e9;
  Plan slow = make_plan(cfg, req, b, DType::bf16, slow_cpu);
  ASSERT_TRUE(slow.fits) << slow.advice;
  ASSERT_TRUE(slow.engine.from_master());
  EXPECT_EQ(slow.bound, Plan::Bound::cpu_optimizer);
  Plan fast = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(fast.fits) << fast.advice;
  ASSERT_TRUE(fast.engine.from_master());
  EXPECT_EQ(fast.bound, Plan::Bound::gpu_compute);
}

// The plan says what bounds the step and what would help: on the H200 model, 8B batch 8 at
// 24 GiB waits for the CPU optimizer, batch 32 for its kernels; with a free optimizer and
// little GPU memory, a small batch waits for PCIe.
TEST(Planner, SaysWhatBoundsTheStep) {
  ModelConfig cfg = model_preset("llama3-8b");
  Budget b{size_t(24) << 30, size_t(112) << 30, false};
  Plan b8 = make_plan(cfg, {8 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  EXPECT_EQ(b8.bound, Plan::Bound::cpu_optimizer);
  std::string d = describe_plan(cfg, {8 * 1024, 1, 1024}, b, b8);
  EXPECT_NE(d.find("bound      the CPU optimizer"), std::string::npos) << d;
  EXPECT_NE(d.find("--grad-accum"), std::string::npos) << d;
  Plan b32 = make_plan(cfg, {32 * 1024, 1, 1024}, b, DType::bf16, HardwareModel{});
  EXPECT_EQ(b32.bound, Plan::Bound::gpu_compute);
  HardwareModel fast_cpu;
  fast_cpu.adamw_params_per_s = 1e12;
  Budget small{size_t(8) << 30, size_t(112) << 30, false};
  Plan b1 = make_plan(cfg, {1 * 1024, 1, 1024}, small, DType::bf16, fast_cpu);
  ASSERT_TRUE(b1.fits) << b1.advice;
  EXPECT_EQ(b1.bound, Plan::Bound::transfers);
  d = describe_plan(cfg, {1 * 1024, 1, 1024}, small, b1);
  EXPECT_NE(d.find("bound      PCIe transfers"), std::string::npos) << d;
}

// Long sequences keep every layer's attention output and lse for the backward when there is
// room: 8B at 1 x 32768 on an 80 GiB GPU on the device (8.1 GiB), the backward then skips
// 32 attention forwards (4 Q ctx T FLOPs each at the attention rate: 32 ms) and the plan
// says so; on a 16 GiB GPU on the host as far as the host has room for it (8.1 GiB for all,
// over PCIe both ways, hidden under the compute), not when it has none; short sequences (1K: the
// attention is ~1.4% of the compute) and --no-kept-attention never.
TEST(Planner, KeepsTheAttentionAtLongSequencesWhereItFits) {
  ModelConfig cfg = model_preset("llama3-8b");
  const int L = int(cfg.num_hidden_layers);
  StepRequest req{32768, 1, 32768};
  const Budget roomy{size_t(80) << 30, size_t(114) << 30, false};
  const Plan p = make_plan(cfg, req, roomy, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  ASSERT_EQ(p.mode, Plan::Mode::sliding);
  EXPECT_EQ(p.engine.kept_attention_layers, L);
  EXPECT_TRUE(p.engine.kept_attention_on_device);
  StepRequest off = req;
  off.kept_attention = false;
  const Plan q = make_plan(cfg, off, roomy, DType::bf16, HardwareModel{});
  ASSERT_TRUE(q.fits);
  EXPECT_EQ(q.engine.kept_attention_layers, 0);
  EXPECT_LT(p.step_seconds, q.step_seconds);
  // The compute saved: L attention forwards (the same chunks and gradient buffers in both).
  ASSERT_EQ(p.engine.max_chunk_tokens, q.engine.max_chunk_tokens);
  ASSERT_EQ(p.engine.layer_grad_buffers, q.engine.layer_grad_buffers);
  const double ctx = (32768.0 + 1) / 2, att_s1 = 4.0 * double(cfg.q_dim()) * ctx * 32768 / HardwareModel{}.attention_rate(ctx);
  EXPECT_NEAR(q.compute_seconds - p.compute_seconds, L * att_s1, 1e-9 * q.compute_seconds);
  // Counted: 32 layers of att [T, Q] bf16 + lse [Hq, T] f32, each rounded to 256 bytes.
  const size_t per_layer = kept_attention_layout(cfg, 32768, 1, DType::bf16).bytes;
  EXPECT_EQ(per_layer, size_t(32768) * 4096 * 2 + size_t(32) * 32768 * 4);
  // Split chunks of an odd length: each chunk's lse starts 256-byte aligned, as the scratch's.
  const KeptAttentionLayout split = kept_attention_layout(cfg, 1001, 3, DType::bf16);
  EXPECT_EQ(split.lse_offset % 256, 0u);
  EXPECT_EQ(split.lse_stride % 256, 0u);
  EXPECT_GE(split.lse_stride, size_t(32) * 1001 * 4);
  EXPECT_EQ(split.bytes, split.lse_offset + 3 * split.lse_stride);
  bool counted = false;
  for (const MemoryLine& l : p.lines)
    if (l.what == "attention store (32 layers)") {
      counted = true;
      EXPECT_TRUE(l.device);
      EXPECT_EQ(l.bytes, size_t(L) * ((per_layer + 255) / 256 * 256));
    }
  EXPECT_TRUE(counted);
  const std::string text = describe_plan(cfg, req, roomy, p);
  EXPECT_NE(text.find("attention kept for 32 layers (device; not recomputed in the backward)"), std::string::npos)
      << text;
  EXPECT_EQ(describe_plan(cfg, off, roomy, q).find("attention kept"), std::string::npos);

  // 16 GiB: no room on the device; on the host none with 108 GiB (no room left for it), half
  // the layers' with 112 GiB (4.1 GiB), every layer's with 140, each step faster.
  auto on_host = [&](int host_gib) {
    const Budget b{size_t(16) << 30, size_t(host_gib) << 30, false};
    Plan h = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
    EXPECT_TRUE(h.fits) << h.advice;
    EXPECT_TRUE(h.engine.kept_attention_layers == 0 || !h.engine.kept_attention_on_device) << host_gib;
    return h;
  };
  const Plan none = on_host(108), half = on_host(112), all = on_host(140);
  EXPECT_EQ(none.engine.kept_attention_layers, 0);
  EXPECT_EQ(half.engine.kept_attention_layers, L / 2);
  EXPECT_EQ(all.engine.kept_attention_layers, L);
  EXPECT_LT(half.step_seconds, none.step_seconds);
  EXPECT_LT(all.step_seconds, half.step_seconds);
  const std::string half_text = describe_plan(cfg, req, Budget{size_t(16) << 30, size_t(112) << 30, false}, half);
  EXPECT_NE(half_text.find("attention kept for 16 layers (host"), std::string::npos) << half_text;
  EXPECT_NE(half_text.find("attention store (16 layers, pinned)"), std::string::npos) << half_text;

  const Plan short_seq = make_plan(cfg, StepRequest{32 * 1024, 1, 1024}, roomy, DType::bf16, HardwareModel{});
  ASSERT_TRUE(short_seq.fits);
  EXPECT_EQ(short_seq.engine.kept_attention_layers, 0);
}

// The prediction against what the H200 measured (docs/bench-log/engine.md, eighth session, c0fbdb1:
// steady tokens/s, i.e. unclipped steps, 24 GiB window, 112 GiB host; the 8-layer cut resident
// at 55 / 80 GiB). Batch 8 is bound by the CPU's AdamW, whose speed differs by lease (4.4-5.8 G
// params/s; the plan on the GPU machine measures it): its value is the fifth session's, from a
// lease that ran at the default model's 4.2 G/s; the rest are bound by the GPU. The
// plan a user reads before hours of training must be near what they will get: within 6% (counting the whole forward again in the
// recompute, as the planner once did, predicted 8-9% low).
TEST(Planner, PredictsTheMeasuredH200Steps) {
  struct Case {
    int layers, batch, seq;
    double gpu_gib, measured;
  };
  for (Case c : {Case{32, 8, 1024, 24, 4827}, Case{32, 32, 1024, 24, 10620}, Case{32, 64, 1024, 24, 10696},
                 Case{32, 8, 8192, 24, 8106}, Case{8, 32, 1024, 24, 35414},
                 Case{8, 32, 1024, 55, 36418}, Case{8, 64, 1024, 24, 35180},
                 Case{8, 64, 1024, 80, 36869}}) {
    ModelConfig cfg = model_preset("llama3-8b");
    cfg.num_hidden_layers = c.layers;
    // 112 GiB for the buffers and state, as those runs had (their RSS peaked at 113.5 GiB),
    // beside the CUDA runtime the plan now counts.
    const Budget b{size_t(c.gpu_gib * double(size_t(1) << 30)), (size_t(112) << 30) + kCudaRuntimeHostBytes, false};
    StepRequest req{int64_t(c.batch) * c.seq, 1, c.seq};
    req.kept_attention = false;  // those runs recomputed the attention in the backward
    Plan p = make_plan(cfg, req, b, DType::bf16, HardwareModel{}, c.gpu_gib > 24);
    ASSERT_TRUE(p.fits) << p.advice;
    SCOPED_TRACE(cat(c.layers, " layers, ", c.batch, " x ", c.seq, ", ", c.gpu_gib, " GiB: predicted ",
                     p.tokens_per_second, " measured ", c.measured));
    EXPECT_NEAR(p.tokens_per_second / c.measured, 1.0, 0.06);
  }
}

// A clipped step: its host AdamW cannot start before the norm is known. The H200 measured
// 4.07-4.14 s for them at 8B batch 32 (24 GiB), against 3.19-3.22 s unclipped; the plan says
// so in a line of its own. A resident plan (device AdamW) has nothing to add.
TEST(Planner, PredictsClippedSteps) {
  ModelConfig cfg = model_preset("llama3-8b");
  const Budget b{size_t(24) << 30, size_t(112) << 30, false};
  const StepRequest req{32 * 1024, 1, 1024};
  Plan p = make_plan(cfg, req, b, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  EXPECT_NEAR(p.clipped_step_seconds / 4.1, 1.0, 0.10) << p.clipped_step_seconds;
  EXPECT_GT(p.clipped_step_seconds, 1.2 * p.step_seconds);
  const std::string text = describe_plan(cfg, req, b, p);
  EXPECT_NE(text.find("clipped    a step whose gradient norm is clipped: "), std::string::npos)
      << text;
  EXPECT_NE(describe_plan(cfg, req, b, p, true).find("clipped "), std::string::npos);

  cfg.num_hidden_layers = 8;
  Plan r = make_plan(cfg, req, Budget{size_t(130) << 30, size_t(112) << 30, false}, DType::bf16,
                     HardwareModel{});
  ASSERT_EQ(r.mode, Plan::Mode::resident);
  EXPECT_EQ(r.clipped_step_seconds, r.step_seconds);
  EXPECT_EQ(describe_plan(cfg, req, b, r).find("clipped "), std::string::npos);
}


// With clipping on, the search ranks plans by a mix of clipped and unclipped steps: the
// 8-layer cut at 32 x 1024 in a 24 GiB window has plans of equal unclipped steps whose
// clipped steps differ by 8% (more layers' AdamW on the device, fewer resident); ranked by
// the unclipped step alone (clipped_share 0) the slower one won. The mix never loses to it.
TEST(Planner, WithClippingRanksPlansByTheirClippedStepsToo) {
  ModelConfig cfg = model_preset("llama3-8b");
  cfg.num_hidden_layers = 8;
  const Budget b{size_t(24) << 30, (size_t(112) << 30) + kCudaRuntimeHostBytes, false};
  StepRequest req{32 * 1024, 1, 1024};
  req.kept_attention = false;
  const Plan mixed = make_plan(cfg, req, b, DType::bf16, HardwareModel{}, false);
  req.clipped_share = 0;
  const Plan plain_only = make_plan(cfg, req, b, DType::bf16, HardwareModel{}, false);
  ASSERT_TRUE(mixed.fits && plain_only.fits);
  auto mix = [](const Plan& p) { return 0.5 * (p.step_seconds + p.clipped_step_seconds); };
  EXPECT_LE(mix(mixed), mix(plain_only) * 1.005);
  EXPECT_LT(mixed.clipped_step_seconds, 0.95 * plain_only.clipped_step_seconds)
      << mixed.clipped_step_seconds << " vs " << plain_only.clipped_step_seconds;
  EXPECT_LE(mixed.step_seconds, 1.01 * plain_only.step_seconds);
  req.clipped_share = 1.5;
  EXPECT_THROW(make_plan(cfg, req, b, DType::bf16, HardwareModel{}, false), Error);
}


// A window that saves every layer's input but is a little short of host memory replays only
// its top layers' (every 2nd from a layer up) instead of every other layer's: 8B at 1 x 65536
// in 24 GiB with the H200's figures, 0.8 GiB below the host that plan needs (the budget of
// one of its GPU calls), replays 2 of 32 inputs; saving every 2nd throughout is slower.
TEST(Planner, ReplaysOnlyTheTopLayersWhereSavingAllIsALittleShort) {
  ModelConfig cfg = model_preset("llama3-8b");
  HardwareModel hw;
  const double f = 806e12 / 785e12;  // the GEMM probe's reading against kH200ProbeGemmFlops
  hw.device_flops *= f;
  hw.attention_flops = 530e12 * f;   // cuDNN (executor_factory.cpp, set_attention_rate)
  hw.attention_workspace = true;
  hw.attention_flops_no_workspace = 350e12 * f;
  hw.adamw_params_per_s = 5e9;
  StepRequest req{65536, 1, 65536};
  const Budget roomy{size_t(24) << 30, size_t(112.6 * double(size_t(1) << 30)), false};
  const Plan all = make_plan(cfg, req, roomy, DType::bf16, hw);
  ASSERT_TRUE(all.fits) << all.advice;
  EXPECT_EQ(all.engine.n_saved_inputs(32), 32);
  const Budget short_by{roomy.device_bytes, roomy.host_bytes - (size_t(800) << 20), false};
  const Plan top = make_plan(cfg, req, short_by, DType::bf16, hw);
  ASSERT_TRUE(top.fits) << top.advice;
  EXPECT_EQ(top.engine.checkpoint_every, 2);
  EXPECT_GE(top.engine.strided_from, 24);
  EXPECT_GE(top.engine.n_saved_inputs(32), 28);
  EXPECT_NE(describe_plan(cfg, req, short_by, top).find(cat("saved from layer ", top.engine.strided_from, " up")),
            std::string::npos);
  req.checkpoint_every = 2;  // every 2nd throughout (the plans before the top-layer replay)
  const Plan every2 = make_plan(cfg, req, short_by, DType::bf16, hw);
  ASSERT_TRUE(every2.fits) << every2.advice;
  EXPECT_EQ(every2.engine.strided_from, 0);
  EXPECT_LT(top.step_seconds, every2.step_seconds);
  EXPECT_LT(all.step_seconds, top.step_seconds);
}

}  // namespace

namespace {

// A 64 GB workstation with a 24 GB GPU cannot hold Llama-3.1-8B's fp32 master + AdamW
// (96 GB) in RAM: the plan says so and points at --optimizer-dir; with a directory on a disk
// the AdamW moments go there (a disk line, RAM below the budget), slower when the disk is
// slower than the CPU's AdamW; a disk without room for them is named with its free space.
TEST(Planner, PutsTheAdamWMomentsOnDiskWhenRamIsShort) {
  ModelConfig cfg = model_preset("llama3-8b");
  const StepRequest req{32 * 1024, 1, 1024};
  HardwareModel hw;
  hw.adamw_params_per_s = 4e9;
  hw.disk_bytes_per_s = 6e9;  // a PCIe 4 NVMe disk, read + write
  Budget ram{size_t(24) << 30, size_t(56) << 30, false};
  Plan no = make_plan(cfg, req, ram, DType::bf16, hw);
  EXPECT_FALSE(no.fits);
  EXPECT_NE(no.advice.find("--optimizer-dir DIR"), std::string::npos) << no.advice;

  Budget disk = ram;
  disk.moments_dir = "/nvme/sf";
  disk.moments_dir_free = size_t(200) << 30;
  Plan p = make_plan(cfg, req, disk, DType::bf16, hw);
  ASSERT_TRUE(p.fits) << p.advice;
  EXPECT_EQ(p.engine.moments_dir, "/nvme/sf");
  EXPECT_LE(p.host_bytes, disk.host_bytes);
  // Only as many units' moments as RAM cannot hold go to the disk: the fewest that fit.
  const std::vector<StateUnit> units = state_units(ModelLayout::build(cfg));
  const int k = p.engine.disk_moment_units;
  ASSERT_GT(k, 0);
  ASSERT_LT(k, int(units.size()));
  EXPECT_EQ(p.disk_bytes, disk_file_bytes(units, {}, {k}));
  EXPECT_LT(p.disk_bytes, disk_file_bytes(units));
  EXPECT_GT(disk_file_bytes(units), size_t(59) << 30);  // 2 x 4 B x 8.03 B parameters
  {
    EngineConfig fewer = p.engine;
    fewer.disk_moment_units = k - 1;
    size_t host = 0;
    for (const MemoryLine& l : sliding_memory(cfg, fewer, DType::bf16))
      if (!l.device && !l.disk) host += l.bytes;
    EXPECT_GT(host, disk.host_bytes) << "one unit fewer on disk fits too";
  }
  // The optimizer at the disk's pace: the file's bytes read and written.
  EXPECT_TRUE(p.optimizer_disk_bound);
  EXPECT_NEAR(p.optimizer_seconds, 2.0 * double(p.disk_bytes) / 6e9, 1e-6 * p.optimizer_seconds);
  const std::string text = describe_plan(cfg, req, disk, p);
  for (std::string line : {cat("AdamW m, v of ", k, " units (--optimizer-dir)"),
                           cat("AdamW m, v of ", units.size() - size_t(k), " of ", units.size(), " units (RAM)"),
                           std::string("disk tier slots"), std::string("total disk (/nvme/sf)"),
                           std::string("optimizer disk 6.0 GB/s"), std::string("bound      the optimizer's disk")})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;

  // RAM beyond the budget that can cache the moments: they are read from the page cache, but
  // what the sweep writes still goes to the disk (the kernel holds back a writer at the disk's
  // pace): half the disk time, and the CPU's pace where that is slower.
  Budget cached = disk;
  cached.page_cache_bytes = size_t(64) << 30;
  Plan c = make_plan(cfg, req, cached, DType::bf16, hw);
  ASSERT_TRUE(c.fits);
  EXPECT_FALSE(c.engine.moments_streamed);
  EXPECT_TRUE(p.engine.moments_streamed);
  const double cpu_s = double(cfg.num_parameters()) / hw.adamw_params_per_s;
  EXPECT_NEAR(c.optimizer_seconds, std::max(cpu_s, double(c.disk_bytes) / 6e9), 0.02 * c.optimizer_seconds);
  EXPECT_LT(c.optimizer_seconds, 0.75 * p.optimizer_seconds);
  EXPECT_NE(describe_plan(cfg, req, cached, c).find("the page cache holds them"), std::string::npos);
  EXPECT_NE(text.find("streamed from disk every step"), std::string::npos) << text;

  // With RAM for everything, the directory is not used.
  Budget roomy = disk;
  roomy.host_bytes = size_t(120) << 30;
  Plan r = make_plan(cfg, req, roomy, DType::bf16, hw);
  ASSERT_TRUE(r.fits);
  EXPECT_TRUE(r.engine.moments_dir.empty());
  EXPECT_EQ(r.disk_bytes, 0u);
  EXPECT_LT(r.step_seconds, p.step_seconds);
  EXPECT_NE(describe_plan(cfg, req, roomy, r).find("--optimizer-dir /nvme/sf is not used"),
            std::string::npos);

  // A disk without room for them.
  Budget small = disk;
  small.moments_dir_free = size_t(20) << 30;
  Plan s = make_plan(cfg, req, small, DType::bf16, hw);
  EXPECT_FALSE(s.fits);
  EXPECT_NE(s.advice.find("--optimizer-dir /nvme/sf: the AdamW moments need"), std::string::npos)
      << s.advice;
}

// The sliding executor with moments on disk allocates what the plan counts in RAM (the file
// is not RAM) and the file is as large as the plan's disk line.
TEST(Planner, MomentsOnDiskAreNotCountedAsRam) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  EngineConfig ec;
  ec.max_chunk_tokens = 32;
  ec.moments_dir = ::testing::TempDir();
  HostBackend be;
  SlidingWindowExecutor eng(be, cfg, ec);
  ASSERT_TRUE(eng.params().moments_on_disk());
  size_t disk = 0, host_state = 0;
  for (auto& l : sliding_memory(cfg, ec, DType::f32)) {
    if (l.disk) disk += l.bytes;
    if (l.what == "fp32 master") host_state = l.bytes;
  }
  EXPECT_EQ(disk, disk_file_bytes(state_units(ModelLayout::build(cfg))));
  EXPECT_EQ(host_state, eng.params().host_bytes());
}

}  // namespace

namespace {

// A refused plan says which batch does fit: the largest one, at the same sequence length.
TEST(Planner, RefusalNamesTheLargestBatchThatFits) {
  ModelConfig cfg = model_preset("llama3-8b");
  HardwareModel hw;
  const Budget budget{size_t(24) << 30, size_t(112) << 30, false};
  const int64_t seq = 4096;
  Plan p = make_plan(cfg, StepRequest{64 * seq, 1, seq}, budget, DType::bf16, hw);
  ASSERT_FALSE(p.fits);
  const std::string key = "What fits: --batch-size ";
  const size_t at = p.advice.find(key);
  ASSERT_NE(at, std::string::npos) << p.advice;
  const int64_t b = std::stoll(p.advice.substr(at + key.size()));
  ASSERT_GT(b, 0);
  ASSERT_LT(b, 64);
  EXPECT_TRUE(make_plan(cfg, StepRequest{b * seq, 1, seq}, budget, DType::bf16, hw).fits);
  EXPECT_FALSE(make_plan(cfg, StepRequest{(b + 1) * seq, 1, seq}, budget, DType::bf16, hw).fits);
  // A sliding window keeps every micro-batch's layer inputs: more --grad-accum would not fit.
  EXPECT_EQ(p.advice.find("keeps about the same tokens"), std::string::npos) << p.advice;
  EXPECT_NE(p.advice.find("not with more --grad-accum"), std::string::npos) << p.advice;
  EXPECT_FALSE(make_plan(cfg, StepRequest{b * seq, int((64 + b - 1) / b), seq}, budget, DType::bf16, hw).fits);
  // Nothing fits at all: no suggestion.
  const Budget tiny{size_t(1) << 30, size_t(112) << 30, false};
  Plan q = make_plan(cfg, StepRequest{8 * 1024, 1, 1024}, tiny, DType::bf16, hw);
  ASSERT_FALSE(q.fits);
  EXPECT_EQ(q.advice.find(key), std::string::npos) << q.advice;
}

}  // namespace

namespace {

// Where cuDNN's atomic-accumulating attention backward runs, its workspace (f32 dQ and sums,
// growing with the chunk) is a device line of the plan: at least what the H200 allocated for
// 8B's 32K-token chunk (1,082,131,712 B), within the plan's 2 MiB; the window still fits.
TEST(Planner, CountsTheAttentionBackwardsWorkspaceWhereItRuns) {
  const ModelConfig cfg = model_preset("llama3-8b");
  const size_t measured = 1082131712;
  EXPECT_GE(attention_workspace_bytes(cfg, 32768), measured);
  EXPECT_LE(attention_workspace_bytes(cfg, 32768), measured + (size_t(2) << 20));
  const StepRequest req{32768, 1, 32768};
  const Budget budget{size_t(24) << 30, size_t(112) << 30, false};
  HardwareModel hw;
  const Plan without = make_plan(cfg, req, budget, DType::bf16, hw);
  hw.attention_workspace = true;
  const Plan with = make_plan(cfg, req, budget, DType::bf16, hw);
  ASSERT_TRUE(without.fits && with.fits) << with.advice;
  auto line = [](const Plan& p) -> const MemoryLine* {
    for (const MemoryLine& l : p.lines)
      if (l.what == "attention backward workspace (cuDNN)") return &l;
    return nullptr;
  };
  EXPECT_EQ(line(without), nullptr);
  ASSERT_NE(line(with), nullptr);
  EXPECT_TRUE(line(with)->device);
  EXPECT_EQ(line(with)->bytes, attention_workspace_bytes(cfg, with.engine.max_chunk_tokens));
  EXPECT_LE(with.device_bytes, budget.device_bytes);
  // Resident plans count it too (a small model that fits whole).
  const ModelConfig small = model_preset("qwen3-0.6b");
  const Plan res = make_plan(small, StepRequest{4096, 1, 4096}, Budget{size_t(80) << 30, size_t(64) << 30, false},
                             DType::bf16, hw);
  ASSERT_EQ(res.mode, Plan::Mode::resident);
  ASSERT_NE(line(res), nullptr);
  EXPECT_EQ(line(res)->bytes, attention_workspace_bytes(small, 4096));
}

// The smallest device budget (in MiB, within [lo, hi]) at which the step fits.
int64_t smallest_fitting_mib(const ModelConfig& cfg, const StepRequest& req, size_t host, const HardwareModel& hw,
                             int64_t lo, int64_t hi) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const Budget b{size_t(mid) << 20, host, false};
    if (make_plan(cfg, req, b, DType::bf16, hw).fits) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// A step that fits only without cuDNN's backward workspace runs the backward that needs none
// (slower, named in the hardware line) instead of being refused; with room for the workspace
// the plan keeps it, and without a workspace-free rate the refusal stays.
TEST(Planner, FallsBackToTheAttentionBackwardWithoutAWorkspaceWhereOnlyThatFits) {
  const ModelConfig cfg = model_preset("llama3-8b");
  const StepRequest req{65536, 1, 65536};
  const size_t host = size_t(112) << 30;
  HardwareModel with;
  with.attention_flops = 530e12;
  with.attention_workspace = true;
  HardwareModel without = with;
  without.attention_workspace = false;
  without.attention_flops = 350e12;
  const int64_t need_with = smallest_fitting_mib(cfg, req, host, with, 1024, 80 << 10);
  const int64_t need_without = smallest_fitting_mib(cfg, req, host, without, 1024, 80 << 10);
  ASSERT_LT(need_without, need_with);  // the workspace costs device memory
  const Budget tight{size_t(need_without) << 20, host, false};
  ASSERT_FALSE(make_plan(cfg, req, tight, DType::bf16, with).fits);  // no fallback rate: refused
  HardwareModel both = with;
  both.attention_flops_no_workspace = 350e12;
  const Plan fb = make_plan(cfg, req, tight, DType::bf16, both);
  ASSERT_TRUE(fb.fits) << fb.advice;
  EXPECT_TRUE(fb.attention_without_workspace);
  EXPECT_EQ(fb.engine.attention_workspace_bytes, 0u);
  EXPECT_NE(fb.hw.source.find("needs no workspace"), std::string::npos) << fb.hw.source;
  const Plan plain = make_plan(cfg, req, tight, DType::bf16, without);
  EXPECT_DOUBLE_EQ(fb.step_seconds, plain.step_seconds);  // predicted at the fallback's rate
  // Room for the workspace: the faster backward, with its workspace counted.
  const Budget roomy{size_t(need_with) << 20, host, false};
  const Plan fast = make_plan(cfg, req, roomy, DType::bf16, both);
  ASSERT_TRUE(fast.fits) << fast.advice;
  EXPECT_FALSE(fast.attention_without_workspace);
  EXPECT_GT(fast.engine.attention_workspace_bytes, 0u);
}

}  // namespace

namespace {

size_t line_bytes(const Plan& p, const std::string& prefix) {
  size_t n = 0;
  for (const MemoryLine& l : p.lines)
    if (l.what.rfind(prefix, 0) == 0) n += l.bytes;
  return n;
}

// Clipping keeps a bf16 home per layer beside a bf16 master: 4 B/param of weights. When even
// every unit's moments on the disk leave RAM short, the masters whose weights stream from
// those homes go with their moments (never the embedding's): the plan fits, its disk line
// names the masters, the file and the step's disk traffic count them, and one unit fewer on
// the disk does not fit. Without clipping the weights stream from the master itself (it is
// the home), whose RAM such a plan never gives up.
TEST(Planner, PutsBf16MastersOnTheDiskWhenTheMomentsAloneAreNotEnough) {
  const ModelConfig cfg = model_preset("qwen2.5-14b");
  StepRequest req{32 * 1024, 1, 1024};
  req.state_format = StateFormat{MomentFormat::int8, MasterFormat::bf16};
  HardwareModel hw;
  hw.disk_bytes_per_s = 6e9;
  Budget b{size_t(24) << 30, size_t(48) << 30, false};
  b.moments_dir = "/nvme/sf";
  b.moments_dir_free = size_t(200) << 30;
  const Plan p = make_plan(cfg, req, b, DType::bf16, hw);
  ASSERT_TRUE(p.fits) << p.advice;
  EXPECT_FALSE(p.engine.from_master());
  EXPECT_TRUE(p.engine.masters_on_disk);
  EXPECT_LE(p.host_bytes, b.host_bytes);
  const std::vector<StateUnit> units = state_units(ModelLayout::build(cfg));
  const int k = p.engine.disk_moment_units;
  const DiskUnits disk{k, true};
  EXPECT_EQ(p.disk_bytes, disk_file_bytes(units, req.state_format, disk));
  EXPECT_GT(p.disk_bytes, disk_file_bytes(units, req.state_format));  // more than every unit's moments
  const std::vector<char> masters = master_disk_choice(units, disk);
  EXPECT_FALSE(masters[0]);
  int n_masters = 0;
  for (char m : masters) n_masters += m;
  EXPECT_GT(n_masters, 0);
  // The fewest: with every unit's moments and one master fewer, RAM is short.
  if (k > 0) {
    EngineConfig fewer = p.engine;
    fewer.disk_moment_units = k - 1;
    size_t host = 0;
    for (const MemoryLine& l : sliding_memory(cfg, fewer, DType::bf16))
      if (!l.device && !l.disk) host += l.bytes;
    EXPECT_GT(host, b.host_bytes);
  }
  EngineConfig no_masters = p.engine;
  no_masters.masters_on_disk = false;
  no_masters.disk_moment_units = -1;
  size_t host = 0;
  for (const MemoryLine& l : sliding_memory(cfg, no_masters, DType::bf16))
    if (!l.device && !l.disk) host += l.bytes;
  EXPECT_GT(host, b.host_bytes) << "the moments alone on the disk would have been enough";
  if (p.optimizer_disk_bound) {
    EXPECT_NEAR(p.optimizer_seconds, 2.0 * double(p.disk_bytes) / hw.disk_bytes_per_s, 1e-6 * p.optimizer_seconds);
  }
  const std::string text = describe_plan(cfg, req, b, p);
  for (std::string line : {cat("m, v of ", k < 0 ? int(units.size()) : k, " + ", n_masters, " masters (--optimizer-dir)"),
                           std::string("disk tier slots (2 units' m, v, master)"),
                           cat("bf16 master of ", int(units.size()) - n_masters,
                               int(units.size()) - n_masters == 1 ? " unit" : " units")})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;

  // Without clipping the plan may stream the weights from the master instead (no homes); it
  // never puts a master it streams from on the disk.
  StepRequest off = req;
  off.clipping = false;
  const Plan q = make_plan(cfg, off, b, DType::bf16, hw);
  ASSERT_TRUE(q.fits) << q.advice;
  EXPECT_TRUE(!q.engine.masters_on_disk || !q.engine.from_master());
}

// At the smallest host budget that fits only with the masters on the disk too, a disk with
// room for every moment but not for those masters: the refusal names what the directory needs.
TEST(Planner, ADiskShortOfTheMastersIsNamedInTheRefusal) {
  ModelConfig cfg = tiny_config(Arch::qwen3);
  cfg.num_hidden_layers = 8;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.head_dim = 16;
  StepRequest req{2 * 16, 2, 16};
  req.state_format = StateFormat{MomentFormat::int8, MasterFormat::bf16};
  const std::vector<StateUnit> units = state_units(ModelLayout::build(cfg));
  auto plan_at = [&](size_t h, size_t disk_free) {
    Budget b{h, h, true};
    b.moments_dir = "/nvme/sf";
    b.moments_dir_free = disk_free;
    return make_plan(cfg, req, b, DType::f32, HardwareModel{}, false);
  };
  const size_t roomy = size_t(1) << 30;
  size_t lo = 1, hi = roomy;  // the smallest host budget that fits
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (plan_at(mid, roomy).fits) hi = mid;
    else lo = mid + 1;
  }
  const Plan p = plan_at(lo, roomy);
  ASSERT_TRUE(p.fits && p.engine.masters_on_disk);
  const size_t moments = disk_file_bytes(units, req.state_format);
  ASSERT_GT(p.disk_bytes, moments);
  const Plan s = plan_at(lo, moments + 1);
  ASSERT_FALSE(s.fits);
  EXPECT_NE(s.advice.find("--optimizer-dir /nvme/sf: the AdamW moments and bf16 masters need"), std::string::npos)
      << s.advice;
}

// The 32B shape on the H200 machine's 125 GiB (int8 moments + bf16 master, no clipping, a
// 2.1 GB/s disk): every layer's saved input is 40 GiB at 64 x 1024 and pushes 48 GiB of moments
// onto the disk. Saving every 2nd or 3rd layer's input keeps more moments in RAM, so the
// disk, which bounds the step, moves fewer bytes: the planner picks it (predicted faster, for
// the replays' compute), counts only the saved layers' store, and says so; each stride can be
// forced, and a forced 1 plans as before.
TEST(Planner, SavesFewerLayerInputsWhereTheStoreCrowdsOutTheState) {
  const ModelConfig cfg = model_preset("qwen2.5-32b");
  StepRequest req{64 * 1024, 1, 1024};
  req.clipping = false;
  req.state_format = StateFormat{MomentFormat::int8, MasterFormat::bf16};
  HardwareModel hw;
  hw.disk_bytes_per_s = 2.1e9;
  Budget b{size_t(24) << 30, size_t(116) << 30, false};
  b.moments_dir = "/nvme/sf";
  b.moments_dir_free = size_t(60) << 30;
  auto plan_with = [&](int every) {
    StepRequest r = req;
    r.checkpoint_every = every;
    Plan p = make_plan(cfg, r, b, DType::bf16, hw);
    EXPECT_TRUE(p.fits) << every << ": " << p.advice;
    EXPECT_EQ(p.mode, Plan::Mode::sliding);
    return p;
  };
  const Plan all = plan_with(1), two = plan_with(2), three = plan_with(3), chosen = plan_with(0);
  EXPECT_EQ(all.engine.checkpoint_every, 1);
  EXPECT_EQ(two.engine.checkpoint_every, 2);
  EXPECT_EQ(three.engine.checkpoint_every, 3);
  EXPECT_GT(chosen.engine.checkpoint_every, 1);
  // The store: the saved layers' [T, C] bf16 inputs only (wherever they live).
  const size_t x = size_t(64 * 1024) * size_t(cfg.hidden_size) * 2;
  for (const Plan* p : {&all, &two, &three}) {
    const int saved = p->engine.n_saved_inputs(cfg.num_hidden_layers);
    EXPECT_EQ(line_bytes(*p, "activation store ("), size_t(saved) * x) << p->engine.checkpoint_every;
  }
  EXPECT_EQ(two.engine.n_saved_inputs(cfg.num_hidden_layers), 32);
  // Fewer bytes on the disk, more compute, a faster step: the disk bounds it.
  EXPECT_LT(two.disk_bytes, all.disk_bytes);
  EXPECT_GT(two.compute_seconds, all.compute_seconds);
  EXPECT_LT(two.step_seconds, all.step_seconds);
  EXPECT_TRUE(all.optimizer_disk_bound);
  EXPECT_LE(chosen.step_seconds, std::min(two.step_seconds, three.step_seconds) * 1.005);
  const std::string text = describe_plan(cfg, req, b, two);
  EXPECT_NE(text.find("every 2nd layer's input saved (the others' replayed in the backward)"), std::string::npos)
      << text;
  EXPECT_EQ(describe_plan(cfg, req, b, all).find("layer's input saved"), std::string::npos);

  // A forced stride out of range is an error naming the flag.
  StepRequest bad = req;
  bad.checkpoint_every = 4;
  try {
    make_plan(cfg, bad, b, DType::bf16, hw);
    ADD_FAILURE() << "--checkpoint-every 4 was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--checkpoint-every 4"), std::string::npos) << e.what();
  }
}

// The replays' compute: one whole layer forward (projections and attention) per unsaved layer.
// 8B at 1 x 8192 (one chunk size), on a roomy host.
TEST(Planner, CountsOneLayerForwardPerReplayedInput) {
  const ModelConfig cfg = model_preset("llama3-8b");
  StepRequest req{8192, 1, 8192};
  req.kept_attention = false;
  const Budget b{size_t(24) << 30, size_t(112) << 30, false};
  const HardwareModel hw;
  req.checkpoint_every = 1;
  const Plan one = make_plan(cfg, req, b, DType::bf16, hw);
  req.checkpoint_every = 2;
  const Plan two = make_plan(cfg, req, b, DType::bf16, hw);
  ASSERT_TRUE(one.fits && two.fits);
  ASSERT_EQ(one.engine.max_chunk_tokens, 8192);
  ASSERT_EQ(two.engine.max_chunk_tokens, 8192);
  ASSERT_EQ(one.engine.layer_grad_buffers, two.engine.layer_grad_buffers);
  const double T = 8192, C = double(cfg.hidden_size), Q = double(cfg.q_dim()), KV = double(cfg.kv_dim()),
               F = double(cfg.intermediate_size), ctx = (T + 1) / 2;
  const double fwd_s1 = 2 * (C * (Q + 2 * KV) + Q * C + 3 * C * F) * T / (T / (T + 512)) / hw.device_flops;
  const double att_s1 = 4 * Q * ctx * T / hw.attention_rate(ctx);
  EXPECT_NEAR(two.compute_seconds - one.compute_seconds, 16 * (fwd_s1 + att_s1), 1e-9 * one.compute_seconds);
}

// A forced stride of 2 or 3 plans a sliding window even where everything would be resident
// (the resident executors keep every layer's input): the flag is never ignored.
TEST(Planner, AForcedCheckpointStridePlansASlidingWindow) {
  ModelConfig cfg = model_preset("llama3-8b");
  cfg.num_hidden_layers = 8;
  const Budget roomy{size_t(130) << 30, size_t(112) << 30, false};
  StepRequest req{8 * 1024, 1, 1024};
  EXPECT_EQ(make_plan(cfg, req, roomy, DType::bf16, HardwareModel{}).mode, Plan::Mode::resident);
  req.checkpoint_every = 2;
  const Plan p = make_plan(cfg, req, roomy, DType::bf16, HardwareModel{});
  ASSERT_TRUE(p.fits) << p.advice;
  EXPECT_EQ(p.mode, Plan::Mode::sliding);
  EXPECT_EQ(p.engine.checkpoint_every, 2);
}

}  // namespace
