// Data parallel through the sliding-window engine on the host backend (issue 21 item 3): N
// ranks as threads (ThreadCommunicator), each with its own executor over B/N sequences of
// every global batch and one shared state, against ONE rank (the plain engine, no
// DataParallel) over the B sequences, whose chunks are the ranks' shares in rank order.
//
// Where the sums are the same, the results are the same bits: with one chunk per rank share
// (no accumulation) each matrix's gradient is, in both, the chunks' GEMM sums added in rank
// order (0 + g0 = g0 exactly), and the reduce-scatter adds rank 0 + rank 1 + ... (the RMSNorm
// weights' too: the host backend rounds each chunk's double partial to f32 before adding it,
// as a rank's partial is rounded before the ranks add theirs). The embedding's
// rows sum their tokens in token order in the one rank, per rank and then over ranks here: the
// same only when no row has tokens in two ranks' shares, so the bitwise cases give each rank's
// sequences their own tokens (ids = rank mod N). Where they differ (accumulation 2: the one
// rank adds its 2N chunks one after another, a rank adds its own 2 first; shared tokens), the
// results are close, within the tolerances stated at the checks. The loss is summed per chunk
// in f32 in the one rank and per rank then in double here: close always (stated there).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include "backend/host/host_backend.h"
#include "backend/threaded_streams_backend.h"
#include "dist/dist_test_util.h"
#include "dist/shm_communicator.h"
#include "dist/thread_communicator.h"
#include "engine/data_parallel.h"
#include "engine/multi_gpu_plan.h"
#include "engine/executor_factory.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"
#include "optim/param_store.h"

using namespace sf;

namespace {

constexpr int kSeqPerRank = 2, kSeqLen = 12, kSteps = 3;

// Sequence j of a global batch of `world` x kSeqPerRank (rank j % world's). own_tokens: its
// tokens are the ids equal to its rank mod world (no embedding row shared by two ranks).
std::vector<int32_t> sequence(const ModelConfig& cfg, int world, int j, bool own_tokens, uint64_t seed) {
  std::mt19937_64 g(seed * 1000 + uint64_t(j));
  std::vector<int32_t> s;
  const int rank = j % world;
  for (int i = 0; i < kSeqLen; ++i) {
    int32_t t = int32_t(g() % uint64_t(cfg.vocab_size));
    if (own_tokens) t = int32_t((t / world) * world + rank) % int32_t(cfg.vocab_size / world * world);
    s.push_back(t);
  }
  return s;
}

Batch rows_batch(const std::vector<std::vector<int32_t>>& rows) {
  Batch b = Batch::from_rows(rows);
  // The mask path too, at the same places of every sequence (wherever its batch puts it).
  for (size_t i = 0; i < b.labels.size(); ++i)
    if (b.positions[i] % 5 == 3) b.labels[i] = kIgnoreLabel;
  return b;
}

// Rank r's share of micro-batch m of a step: sequences r, r + world, ...
Batch share(const ModelConfig& cfg, int world, int r, bool own_tokens, uint64_t seed) {
  std::vector<std::vector<int32_t>> rows;
  for (int j = r; j < world * kSeqPerRank; j += world) rows.push_back(sequence(cfg, world, j, own_tokens, seed));
  return rows_batch(rows);
}

// The one rank's micro-batch: every share, in rank order (so its chunks are the shares).
Batch whole(const ModelConfig& cfg, int world, bool own_tokens, uint64_t seed) {
  std::vector<std::vector<int32_t>> rows;
  for (int r = 0; r < world; ++r)
    for (int j = r; j < world * kSeqPerRank; j += world) rows.push_back(sequence(cfg, world, j, own_tokens, seed));
  return rows_batch(rows);
}

EngineConfig window(int max_chunks) {
  EngineConfig ec;
  ec.n_slots = 2;
  ec.max_chunk_tokens = kSeqPerRank * kSeqLen;  // one chunk = one rank's share
  ec.max_chunks = max_chunks;
  ec.head_chunk_rows = 256;  // a share's tokens in one LM-head chunk
  return ec;
}

// The ranks' one state and counters, in this process's memory (ranks as threads).
struct SharedState {
  HostArray state, counters;
  DataParallel dp_for(dist::Communicator& comm) {
    DataParallel dp;
    dp.comm = &comm;
    dp.counters = counters.as<UpdateCounters>();
    dp.state = {state.data(), state.bytes()};
    return dp;
  }
  SharedState(const ModelConfig& cfg, int world)
      : state(ParamStore::external_bytes(state_units(ModelLayout::build(cfg))), "test state"),
        counters(UpdateCounters::bytes_for(int(ModelLayout::build(cfg).units.size()), world), "test counters") {
    UpdateCounters::create(counters.data(), int(ModelLayout::build(cfg).units.size()), world);
  }
};

struct Case {
  int world;
  int grad_accum;
  float max_grad_norm;
  bool own_tokens;  // the bitwise condition for the embedding (see the top)
  // The ranks' backends run their streams on lazy threads (tests/engine/test_sliding_window.cpp's
  // LazyStreams): a gradient reduced before its trip home is over would change the bits.
  bool threaded = false;
  // The ranks talk through a ShmCommunicator and share a SharedTrainingState (named shared
  // memory, each rank its own mapping: the processes' path), instead of a ThreadCommunicator
  // and one heap block.
  bool shm = false;
  // Tied embeddings: the table's gradient starts from the head's dense share, which the one
  // rank sums over all chunks before the tokens' rows are added, a rank over its own: close.
  bool tied = false;
  // Ranks 1.. sleep before each slice update (EngineTestModes::rank_update_delay_ms): a rank
  // that loaded a unit before every slice was in would train on old weights.
  bool late_slices = false;
  // The ranks save every 2nd layer's input and replay the rest (EngineConfig::checkpoint_every;
  // the one rank saves all): the same bits.
  int checkpoint_every = 1;
  bool bitwise() const { return grad_accum == 1 && own_tokens && !tied; }
  std::string name() const {
    return cat("world", world, "_accum", grad_accum, max_grad_norm > 0 ? "_clip" : "_noclip",
               own_tokens ? "_owntokens" : "_sharedtokens", threaded ? "_threaded" : "", shm ? "_shm" : "",
               tied ? "_tied" : "", late_slices ? "_lateslices" : "",
               checkpoint_every > 1 ? cat("_ckpt", checkpoint_every) : "");
  }
};

// One rank's backend: the host backend, or it behind lazy threaded streams.
struct RankBackend {
  HostBackend host;
  std::unique_ptr<ThreadedStreamsBackend> threaded;
  explicit RankBackend(bool lazy_threads) {
    ThreadedStreamsBackend::Options o;
    o.lazy = true;
    if (lazy_threads) threaded = std::make_unique<ThreadedStreamsBackend>(host, o);
  }
  Backend& be() { return threaded ? static_cast<Backend&>(*threaded) : host; }
};

class DataParallelEngine : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelEngine, EqualsOneRankOverTheGlobalBatch) {
  const Case& tc = GetParam();
  const int N = tc.world;
  ModelConfig cfg = tiny_config(Arch::llama, tc.tied);
  const ModelLayout layout = ModelLayout::build(cfg);
  OptimHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1f;
  h.max_grad_norm = tc.max_grad_norm;
  InitOptions init;
  init.norm_jitter = 0.1f;

  HostBackend be_ref;
  SlidingWindowExecutor ref(be_ref, cfg, window(N * tc.grad_accum));
  auto initial = [&](int u) {
    std::vector<float> w(size_t(layout.units[size_t(u)].numel), 0.f);
    init_unit(layout.units[size_t(u)], w.data(), 7, init);
    return w;
  };
  for (int u = 0; u < int(layout.units.size()); ++u) ref.params().write_master_f32(u, initial(u).data());
  ref.params_changed();

  // The ranks' communicators: over one ThreadGroup, or over one shared-memory region.
  SharedState shared(cfg, N);
  auto group = std::make_shared<dist::ThreadGroup>(N, dist::Timeout(120000));
  std::vector<std::unique_ptr<dist::Communicator>> comms;
  const std::string run_id = dist::new_run_id();
  const size_t capacity = 4096;  // bytes per rank: every reduce-scatter in pieces
  if (tc.shm) {
    const std::string name = dist::shared_region_name(run_id, "comm");
    dist::SharedRegion made = dist::SharedRegion::create(name, dist::ShmCommunicator::region_bytes(N, capacity));
    dist::ShmCommunicator::init(made.data(), N, capacity);
    comms.push_back(std::make_unique<dist::ShmCommunicator>(std::move(made), 0, N, dist::Timeout(120000)));
    for (int r = 1; r < N; ++r)
      comms.push_back(std::make_unique<dist::ShmCommunicator>(
          dist::SharedRegion::open(name, dist::ShmCommunicator::region_bytes(N, capacity)), r, N, dist::Timeout(120000)));
    static_cast<dist::ShmCommunicator&>(*comms[0]).unlink();
  } else {
    for (int r = 0; r < N; ++r) comms.push_back(std::make_unique<dist::ThreadCommunicator>(group, r));
  }
  std::vector<std::unique_ptr<SharedTrainingState>> states(static_cast<size_t>(N));
  std::vector<std::unique_ptr<RankBackend>> bes(static_cast<size_t>(N));
  std::vector<std::unique_ptr<SlidingWindowExecutor>> ranks(static_cast<size_t>(N));

  std::vector<std::vector<StepStats>> got(static_cast<size_t>(N));
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      try {
        DataParallel dp = shared.dp_for(*comms[size_t(r)]);
        if (tc.shm) {  // collective: rank 0 makes the regions, the others open them
          states[size_t(r)] = std::make_unique<SharedTrainingState>(*comms[size_t(r)], run_id,
                                                                    state_units(layout), StateFormat{});
          dp = states[size_t(r)]->data_parallel();
        }
        bes[size_t(r)] = std::make_unique<RankBackend>(tc.threaded);
        EngineTestModes test;
        if (tc.late_slices) test.rank_update_delay_ms = 5;
        EngineConfig ec = window(tc.grad_accum);
        ec.checkpoint_every = tc.checkpoint_every;
        ranks[size_t(r)] = std::make_unique<SlidingWindowExecutor>(bes[size_t(r)]->be(), cfg, ec, test, dp);
        if (r == 0)  // rank 0 alone writes the shared state
          for (int u = 0; u < int(layout.units.size()); ++u) ranks[0]->params().write_master_f32(u, initial(u).data());
        ranks[size_t(r)]->params_changed();  // collective: rank 0's writes are in
        for (int step = 0; step < kSteps; ++step) {
          std::vector<Batch> micro;
          for (int m = 0; m < tc.grad_accum; ++m)
            micro.push_back(share(cfg, N, r, tc.own_tokens, uint64_t(10 * step + m + 1)));
          got[size_t(r)].push_back(ranks[size_t(r)]->train_step(micro, h));
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < N; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;

  bool clipped = false;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Batch> micro;
    for (int m = 0; m < tc.grad_accum; ++m) micro.push_back(whole(cfg, N, tc.own_tokens, uint64_t(10 * step + m + 1)));
    const StepStats want = ref.train_step(micro, h);
    clipped |= want.clip_coef < 1;
    for (int r = 0; r < N; ++r) {
      const StepStats& st = got[size_t(r)][size_t(step)];
      SCOPED_TRACE(cat("rank ", r, " step ", step));
      EXPECT_EQ(st.n_valid, want.n_valid);
      EXPECT_EQ(st.n_tokens, want.n_tokens);
      // The loss: the one rank rounds its running f32 sum after each of N x accum chunks, a
      // rank its own chunks' (then the ranks add in double): <= 2N x accum roundings of 2^-24.
      EXPECT_NEAR(st.loss(), want.loss(), 1e-6 * want.loss());
      // The norm: in the bitwise cases the same gradients, their squares summed per rank slice
      // and then over ranks in double: a relative 1e-7 of the norm at most; where the gradients differ
      // by their f32 summation order (accumulation, shared tokens), a relative 1e-5 (as the
      // sliding-vs-resident tests).
      EXPECT_NEAR(st.grad_norm, want.grad_norm, (tc.bitwise() ? 1e-7 : 1e-5) * want.grad_norm);
      if (tc.bitwise()) EXPECT_EQ(st.clip_coef, want.clip_coef);
      else EXPECT_NEAR(st.clip_coef, want.clip_coef, 1e-5);
    }
  }
  EXPECT_EQ(clipped, tc.max_grad_norm > 0) << "the clipping cases clip, the others do not";

  ParamStore &a = ref.params(), &b = ranks[0]->params();  // b: every rank's slices are in
  EXPECT_EQ(a.step, b.step);
  for (int u = 0; u < a.n_units(); ++u) {
    const size_t n = size_t(a.numel(u));
    if (tc.bitwise()) {
      EXPECT_EQ(std::memcmp(a.master(u), b.master(u), n * 4), 0) << "master of unit " << u;
      for (const ParamRange& r : a.ranges(u)) {
        const size_t off = size_t(r.offset), len = size_t(r.numel);
        EXPECT_EQ(std::memcmp(a.m(u) + off, b.m(u) + off, len * 4), 0) << "m of unit " << u << " at " << off;
        EXPECT_EQ(std::memcmp(a.v(u) + off, b.v(u) + off, len * 4), 0) << "v of unit " << u << " at " << off;
      }
      continue;
    }
    // Gradients a few f32 ulps apart: after 3 AdamW steps of lr 3e-3 the weights agree to
    // 1e-5 absolute (an update is lr x m / sqrt(v), and m / sqrt(v) moves by the gradient's
    // relative change, ~1e-6, except for elements whose gradient is itself rounding noise).
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(a.master(u)[i] - b.master(u)[i])));
    EXPECT_LT(worst, 1e-5) << "master of unit " << u;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataParallelEngine,
                         ::testing::Values(Case{2, 1, 0.f, true}, Case{2, 1, 0.05f, true}, Case{3, 1, 0.f, true},
                                           Case{3, 1, 0.05f, true}, Case{2, 2, 0.f, false},
                                           Case{3, 2, 0.05f, false}, Case{2, 1, 0.05f, false},
                                           Case{2, 1, 0.05f, true, true}, Case{3, 2, 0.f, false, true},
                                           Case{3, 1, 0.05f, true, false, true}, Case{2, 2, 0.05f, false, true, true},
                                           Case{2, 1, 0.05f, true, false, false, true},
                                           Case{3, 2, 0.f, false, true, false, true},
                                           Case{3, 1, 0.f, true, false, false, false, true},
                                           Case{2, 1, 0.05f, true, true, true, false, true},
                                           Case{2, 1, 0.05f, true, true, false, false, false, 2},
                                           Case{3, 2, 0.f, false, false, true, false, false, 2}),
                         [](const auto& info) { return info.param.name(); });

// A rank whose step throws (here: a token outside the vocabulary in rank 1's share at step 1,
// found once the step's collectives are under way) stops the others: they throw an Error
// naming it instead of waiting for it, and no thread hangs.
TEST(DataParallelEngine, AFailingRankStopsTheOthersWithAnErrorNamingIt) {
  const int N = 3;
  ModelConfig cfg = tiny_config(Arch::llama, false);
  SharedState shared(cfg, N);
  auto group = std::make_shared<dist::ThreadGroup>(N, dist::Timeout(120000));
  std::vector<std::unique_ptr<dist::ThreadCommunicator>> comms;
  std::vector<std::unique_ptr<HostBackend>> bes;
  std::vector<std::unique_ptr<SlidingWindowExecutor>> ranks;
  for (int r = 0; r < N; ++r) {
    comms.push_back(std::make_unique<dist::ThreadCommunicator>(group, r));
    bes.push_back(std::make_unique<HostBackend>());
    ranks.push_back(std::make_unique<SlidingWindowExecutor>(*bes.back(), cfg, window(1), EngineTestModes{},
                                                            shared.dp_for(*comms.back())));
  }
  std::vector<int> steps_done(static_cast<size_t>(N), 0);
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      try {
        ranks[size_t(r)]->params_changed();
        for (int step = 0; step < 3; ++step) {
          Batch b = share(cfg, N, r, false, uint64_t(step + 1));
          if (r == 1 && step == 1) b.tokens[5] = int32_t(cfg.vocab_size + 4);  // the injected fault
          ranks[size_t(r)]->train_step(std::span<const Batch>(&b, 1), OptimHyper{});
          ++steps_done[size_t(r)];
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < N; ++r) {
    SCOPED_TRACE(cat("rank ", r));
    EXPECT_EQ(steps_done[size_t(r)], 1) << "every rank stops in the failing step";
    ASSERT_NE(errors[size_t(r)], "");
    EXPECT_NE(errors[size_t(r)].find("token id"), std::string::npos) << errors[size_t(r)];
    if (r != 1) {
      EXPECT_NE(errors[size_t(r)].find("rank 1"), std::string::npos) << errors[size_t(r)];
    }
  }
}

// The per-unit "all slices updated" wait: returns once every rank's slice of the round is in,
// names the ranks behind after the timeout, and stops at once with a failed rank's message.
TEST(UpdateCounters, WaitsForEveryRanksSliceNamesTheLateAndCarriesAFailure) {
  HostArray mem(UpdateCounters::bytes_for(3, 4), "test counters");
  UpdateCounters* c = UpdateCounters::create(mem.data(), 3, 4);
  EXPECT_EQ(UpdateCounters::attach(mem.data(), 3, 4), c);
  EXPECT_THROW(UpdateCounters::attach(mem.data(), 3, 2), Error);  // another run's shape
  c->wait(1, 0, dist::Timeout(10));  // round 0: nothing to wait for
  for (int r : {0, 1, 3}) c->slice_done(1, r, 1);
  try {
    c->wait(1, 1, dist::Timeout(50));
    ADD_FAILURE() << "waited past a missing slice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 did not update their slice of unit 1"), std::string::npos)
        << e.what();
  }
  std::thread late([&] { c->slice_done(1, 2, 1); });
  late.join();
  c->wait(1, 1, dist::Timeout(1000));
  c->fail(3, "rank 3: its disk is full");
  c->fail(0, "a later failure does not replace the first");
  EXPECT_EQ(c->failed_rank(), 3);
  try {
    c->wait(2, 1, dist::Timeout(60000));
    ADD_FAILURE() << "a failed rank did not stop the wait";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 failed while this rank waited for the update of unit 2"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("its disk is full"), std::string::npos) << e.what();
  }
}

// A rank's plan: the sliding window even where everything fits (the resident engine has no
// ranks), the deferred update, every gradient kept for the norm (no plan from the master),
// and the rank's data-parallel buffers counted in its host memory.
TEST(DataParallelEngine, PlansARanksWindowWithItsBuffers) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  auto group = std::make_shared<dist::ThreadGroup>(2, dist::Timeout(1000));
  dist::ThreadCommunicator comm(group, 0);
  DataParallel dp;
  dp.comm = &comm;
  ExecutorRequest req;
  req.backend = "host";
  req.step.micro_tokens = 64;
  req.step.max_seq_len = 32;
  req.step.clipping = false;  // a one-rank plan could then stream from the master
  const PlannedRun one = plan_run(cfg, req);
  req.data_parallel = &dp;
  const PlannedRun rank = plan_run(cfg, req);
  EXPECT_EQ(one.plan.mode, Plan::Mode::resident);
  ASSERT_EQ(rank.plan.mode, Plan::Mode::sliding);
  EXPECT_FALSE(rank.plan.engine.speculative());
  EXPECT_FALSE(rank.plan.engine.from_master());
  std::vector<int64_t> numels;
  for (const Unit& u : ModelLayout::build(cfg).units) numels.push_back(u.numel);
  const size_t dp_bytes = ShardedUpdate::host_bytes(numels, 2);
  EXPECT_GT(dp_bytes, size_t(4) * size_t(cfg.vocab_size * cfg.hidden_size));  // the dense embedding at least
  bool counted = false;
  for (const MemoryLine& l : rank.plan.lines) counted |= l.what.find("data parallel") != std::string::npos && l.bytes == dp_bytes;
  EXPECT_TRUE(counted) << describe_plan(cfg, req.step, rank.budget, rank.plan);
  // The host is the ranks' one: a rank plans within the state's shared copy and half the rest.
  req.host_memory = "1GiB";
  const PlannedRun shared = plan_run(cfg, req);
  size_t state = 0;
  for (const MemoryLine& l : shared.plan.lines) state += host_line_shared(l) ? l.bytes : 0;
  ASSERT_GT(state, 0u);
  EXPECT_EQ(shared.budget.host_bytes, state + ((size_t(1) << 30) - state) / 2);
  req.host_memory.clear();
  req.engine = "resident";
  EXPECT_THROW(plan_run(cfg, req), Error);
}

// The modes not built for several ranks are refused by name before anything runs.
TEST(DataParallelEngine, RefusesTheModesItDoesNotRun) {
  ModelConfig cfg = tiny_config(Arch::llama, false);
  SharedState shared(cfg, 1);
  auto group = std::make_shared<dist::ThreadGroup>(1, dist::Timeout(1000));
  dist::ThreadCommunicator comm(group, 0);
  HostBackend be;
  auto refused = [&](EngineConfig ec, const char* says) {
    try {
      SlidingWindowExecutor e(be, cfg, ec, EngineTestModes{}, shared.dp_for(comm));
      ADD_FAILURE() << "not refused: " << says;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(says), std::string::npos) << err.what();
    }
  };
  EngineConfig spec = window(1);
  spec.speculation = EngineConfig::Speculation::always;
  refused(spec, "speculative update");
  EngineConfig master = window(1);
  master.host_weights = EngineConfig::HostWeights::master;
  refused(master, "streaming the weights from the master");
  EngineConfig compact = window(1);
  compact.state_format.moments = MomentFormat::bf16;
  refused(compact, "--optimizer-state");
  EngineConfig disk = window(1);
  disk.moments_dir = ::testing::TempDir();
  refused(disk, "--optimizer-dir");
  EngineConfig dev = window(1);
  dev.device_adamw_layers = 1;
  refused(dev, "--device-adamw-layers");
  // World 1 through the same path runs (and is the one-rank engine's step).
  SlidingWindowExecutor ok(be, cfg, window(1), EngineTestModes{}, shared.dp_for(comm));
  EXPECT_NE(std::string(ok.name()).find("rank 0 of 1"), std::string::npos) << ok.name();
}

// The GPU path's shared homes as `train` maps them (SharedTrainingState::map_homes, after the
// plan): one named region for the ranks, page-aligned, the same memory for every rank (rank 1
// reads what rank 0 wrote), gone from /dev/shm once mapped; ranks whose plans want different
// bytes are refused, every rank naming the figures; 0 bytes maps nothing.
TEST(DataParallelEngine, SharedHomesAreOneRegionTheRanksMapTogether) {
  const int N = 2;
  const ModelConfig cfg = tiny_config(Arch::llama, false);
  const std::vector<StateUnit> units = state_units(ModelLayout::build(cfg));
  auto thread_ranks = [&] {
    auto group = std::make_shared<dist::ThreadGroup>(N, dist::Timeout(60000));
    std::vector<std::unique_ptr<dist::ThreadCommunicator>> comms;
    for (int r = 0; r < N; ++r) comms.push_back(std::make_unique<dist::ThreadCommunicator>(group, r));
    return comms;
  };
  auto comms = thread_ranks();
  const std::string run_id = dist::new_run_id();
  const size_t bytes = size_t(3) << 20;
  std::vector<uint64_t> seen(static_cast<size_t>(N), 0);
  std::vector<std::string> errors = dist::test::run_ranks(N, [&](int r) {
    SharedTrainingState st(*comms[size_t(r)], run_id, units, StateFormat{});
    EXPECT_EQ(st.data_parallel().homes.base, nullptr) << "nothing before the plan";
    st.map_homes(bytes);
    const DataParallel dp = st.data_parallel();
    ASSERT_NE(dp.homes.base, nullptr);
    EXPECT_GE(dp.homes.bytes, bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dp.homes.base) % 4096, 0u);
    if (r == 0) static_cast<uint64_t*>(dp.homes.base)[bytes / 8 - 1] = 0x5ead5ead5ead5eadull;
    comms[size_t(r)]->barrier();
    seen[size_t(r)] = static_cast<const uint64_t*>(dp.homes.base)[bytes / 8 - 1];
    comms[size_t(r)]->barrier();  // both read before either unmaps
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(seen[size_t(r)], 0x5ead5ead5ead5eadull) << "rank " << r << " sees rank 0's write";
  }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + dist::shared_region_name(run_id, "homes").substr(1)))
      << "the name is removed once every rank has mapped it";

  // Plans that disagree: every rank refuses, naming its bytes and the ranks' mean.
  comms = thread_ranks();
  const std::string run2 = dist::new_run_id();
  errors = dist::test::run_ranks(N, [&](int r) {
    SharedTrainingState st(*comms[size_t(r)], run2, units, StateFormat{});
    st.map_homes(size_t(r + 1) << 20);
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_NE(errors[size_t(r)].find("planned different streamed homes"), std::string::npos) << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find(cat("rank ", r, ": ", r + 1, " MiB")), std::string::npos) << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("--gpu-memory"), std::string::npos) << errors[size_t(r)];
  }
}

}  // namespace
