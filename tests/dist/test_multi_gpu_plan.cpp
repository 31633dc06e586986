// plan --gpus N's model (engine/multi_gpu_plan.h): which host lines are one shared copy, the
// host/device totals, the exchange the backward cannot hide, and the refusals.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/multi_gpu_plan.h"
#include "model/model_presets.h"
#include "model/param_layout.h"

namespace sf {
namespace {

constexpr size_t kGiB = size_t(1) << 30;

// The 8B shape of issue 21 (32 x 1024 per GPU) on a 24 GiB GPU budget, H200 figures
// (HardwareModel's defaults: nothing measured, so the test is deterministic).
Plan rank_plan_8b(size_t host = 200 * kGiB, int ranks = 1, DType cd = DType::bf16) {
  StepRequest req;
  req.micro_tokens = 32 * 1024;
  req.max_seq_len = 1024;
  req.data_parallel_ranks = ranks;
  Budget b;
  b.device_bytes = 24 * kGiB;
  b.host_bytes = host;
  return make_plan(model_preset("llama3-8b"), req, b, cd, HardwareModel{});
}

size_t line_bytes(const Plan& p, const std::string& prefix) {
  size_t n = 0;
  for (const MemoryLine& l : p.lines)
    if (!l.device && l.what.rfind(prefix, 0) == 0) n += l.bytes;
  return n;
}

TEST(MultiGpuPlan, SharesTheStateButNotTheRanksBuffers) {
  const Plan p = rank_plan_8b();
  ASSERT_TRUE(p.fits) << p.advice;
  size_t shared = 0, rank = 0;
  bool saw_state = false, saw_runtime = false;
  for (const MemoryLine& l : p.lines) {
    if (l.device || l.disk) {
      EXPECT_FALSE(host_line_shared(l)) << l.what;
      continue;
    }
    (host_line_shared(l) ? shared : rank) += l.bytes;
    if (l.what == "fp32 master + AdamW m, v") saw_state = host_line_shared(l);
    if (l.what.rfind("CUDA runtime", 0) == 0) saw_runtime = !host_line_shared(l);
    if (l.what.rfind("update ring", 0) == 0 || l.what.rfind("activation store", 0) == 0) {
      EXPECT_FALSE(host_line_shared(l)) << l.what << ": one per rank";
    }
    // A one-rank plan shares nothing but the state (the ranks' plans below share the homes).
    if (l.what.rfind("weights/gradient homes", 0) == 0 || l.what.rfind("next weights", 0) == 0) {
      EXPECT_FALSE(host_line_shared(l)) << l.what << ": one per rank";
    }
  }
  EXPECT_TRUE(saw_state);
  EXPECT_TRUE(saw_runtime);
  EXPECT_EQ(shared + rank, p.host_bytes);
  // The state alone is 12 B/param: most of the host.
  EXPECT_GT(shared, rank);

  const ModelConfig cfg = model_preset("llama3-8b");
  for (int n : {1, 2, 4, 8}) {
    MultiGpuRequest req;
    req.gpus = n;
    const MultiGpuPlan m = predict_multi_gpu(cfg, p, 32 * 1024, 1000 * kGiB, 24 * kGiB + kGiB, req);
    EXPECT_EQ(m.host_shared_bytes, shared);
    EXPECT_EQ(m.host_rank_bytes, rank);
    EXPECT_EQ(m.host_bytes, shared + size_t(n) * rank) << n << " GPUs";
    EXPECT_EQ(m.device_bytes_per_gpu, p.device_bytes + (n > 1 ? req.nccl_device_bytes : 0));
    EXPECT_TRUE(m.fits) << m.advice;
  }
}

// A plan for one of N ranks on the GPU path: its streamed homes are the one copy the ranks
// share (window_buffers.h, Tier::host_shared), counted once per host; its accumulators are
// padded for N; it runs (and is predicted with) the deferred update, the one several ranks
// run. With an fp32 compute dtype a home holds a rank's own gradient: not shared.
TEST(MultiGpuPlan, TheRanksShareOneCopyOfTheStreamedHomes) {
  const Plan one = rank_plan_8b(), four = rank_plan_8b(200 * kGiB, 4);
  ASSERT_TRUE(one.fits && four.fits) << one.advice << four.advice;
  EXPECT_EQ(one.engine.data_parallel_world, 1);
  EXPECT_EQ(four.engine.data_parallel_world, 4);
  EXPECT_EQ(one.engine.speculation, EngineConfig::Speculation::always);
  // What a rank runs: the deferred update, every layer's AdamW on the host, a sliding window
  // (checked_for_ranks refuses the rest), even where one GPU alone would do otherwise.
  EXPECT_EQ(four.engine.speculation, EngineConfig::Speculation::off);
  EXPECT_EQ(four.engine.device_adamw_layers, 0);
  EXPECT_EQ(four.mode, Plan::Mode::sliding);
  const std::string shared_homes = "weights/gradient homes (streamed, one copy the ranks share)";
  EXPECT_EQ(line_bytes(one, shared_homes), 0u);
  EXPECT_GT(line_bytes(one, "weights/gradient homes (streamed)"), 0u) << "one rank: its own homes";
  // 2 B/param of each streamed layer (neither resident nor updated on the device), in whole
  // 64 KiB pieces.
  const ModelConfig cfg = model_preset("llama3-8b");
  const ModelLayout layout = ModelLayout::build(cfg);
  size_t want = 0;
  for (int k = four.engine.device_adamw_layers; k < layout.n_layers - four.engine.resident_layers; ++k)
    want += (size_t(layout.layer(k).numel) * 2 + 65535) / 65536 * 65536;
  const size_t homes = line_bytes(four, shared_homes);
  EXPECT_EQ(homes, want);
  ASSERT_GT(homes, size_t(4) * kGiB) << "most layers streamed";
  size_t shared = 0, rank = 0;
  for (const MemoryLine& l : four.lines) {
    if (l.device || l.disk) continue;
    if (l.what == shared_homes) EXPECT_TRUE(host_line_shared(l));
    if (l.what.rfind("weights/gradient homes", 0) == 0 && l.what != shared_homes) ADD_FAILURE() << l.what;
    (host_line_shared(l) ? shared : rank) += l.bytes;
  }
  MultiGpuRequest req;
  req.gpus = 4;
  const MultiGpuPlan m = predict_multi_gpu(cfg, four, 32 * 1024, 1000 * kGiB, 25 * kGiB, req);
  EXPECT_EQ(m.host_shared_bytes, shared);
  EXPECT_EQ(m.host_bytes, shared + 4 * rank) << "the homes once, not 4 times";
  // The speedup is over what one GPU runs alone (its own, speculative plan), not over a rank.
  EXPECT_GE(four.step_seconds, one.step_seconds) << "the deferred update is not predicted faster";
  req.one_gpu_step_seconds = one.step_seconds;
  const MultiGpuPlan over_one = predict_multi_gpu(cfg, four, 32 * 1024, 1000 * kGiB, 25 * kGiB, req);
  EXPECT_DOUBLE_EQ(over_one.speedup, 4 * one.step_seconds / over_one.step_seconds);
  EXPECT_LE(over_one.speedup, m.speedup);
  EXPECT_NE(describe_multi_gpu(over_one, four).find("its own plan"), std::string::npos);

  StepRequest sr;
  sr.micro_tokens = 1024;
  sr.data_parallel_ranks = 2;
  Budget big;
  big.device_bytes = big.host_bytes = 1000 * kGiB;
  EXPECT_EQ(make_plan(model_preset("llama3-1b"), sr, big, DType::bf16, HardwareModel{}).mode, Plan::Mode::sliding)
      << "a model that fits one GPU whole still runs the ranks' sliding window";
  try {
    make_plan(cfg, sr, big, DType::bf16, HardwareModel{}, true, 2);
    ADD_FAILURE() << "--device-adamw-layers 2 was planned for 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device-adamw-layers 2: data parallel"), std::string::npos) << e.what();
  }

  const Plan f32 = rank_plan_8b(2000 * kGiB, 4, DType::f32);
  ASSERT_EQ(f32.mode, Plan::Mode::sliding);
  EXPECT_EQ(line_bytes(f32, shared_homes), 0u) << "fp32 compute: each rank's homes hold its own gradients";
  EXPECT_GT(line_bytes(f32, "weights/gradient homes (streamed)"), 0u);
}

TEST(MultiGpuPlan, OneGpuIsTheRanksPlanUnchanged) {
  const Plan p = rank_plan_8b();
  const MultiGpuPlan m = predict_multi_gpu(model_preset("llama3-8b"), p, 32 * 1024, 200 * kGiB, 24 * kGiB, {});
  EXPECT_EQ(m.host_bytes, p.host_bytes);
  EXPECT_EQ(m.device_bytes_per_gpu, p.device_bytes);
  EXPECT_EQ(m.exposed_exchange_seconds, 0.0);
  EXPECT_EQ(m.step_seconds, p.step_seconds);
  EXPECT_DOUBLE_EQ(m.speedup, 1.0);
}

// A synthetic rank plan: the model's numbers only, a sliding window with its AdamW on the host.
Plan synthetic(double compute_seconds, int device_adamw_layers = 0) {
  Plan p;
  p.mode = Plan::Mode::sliding;
  p.engine.device_adamw_layers = device_adamw_layers;
  p.fits = true;
  p.compute_seconds = compute_seconds;
  p.step_seconds = p.clipped_step_seconds = compute_seconds + 1.0;
  p.tokens_per_second = 1000.0 / p.step_seconds;
  p.lines = {{"fp32 master + AdamW m, v", 100, false}, {"update ring (2)", 10, false}, {"weight slots (2)", 5, true}};
  p.host_bytes = 110;
  p.device_bytes = 5;
  return p;
}

TEST(MultiGpuPlan, ALongBackwardHidesEveryExchangeButLayerZerosAndTheEmbeddingRows) {
  const ModelConfig cfg = model_preset("llama3-8b");
  const ModelLayout l = ModelLayout::build(cfg);
  const double tokens = 1000, link = gpu_link_bytes_per_s(GpuLink::nvlink);
  for (int n : {2, 4}) {
    MultiGpuRequest req;
    req.gpus = n;
    // 1e4 s of compute: every layer's backward outlasts its exchange.
    const MultiGpuPlan m = predict_multi_gpu(cfg, synthetic(1e4), tokens, 1000, 1000, req);
    // Layer 0's reduce-scatter (4 B x P x (N-1)/N) and every other rank's rows (f32 [rows, C]).
    const double want = 4.0 * double(l.layer(0).numel) * (n - 1) / n / link +
                        4.0 * tokens * cfg.hidden_size * (n - 1) / link;
    // Relative 1e-12: the same double arithmetic summed in another order.
    EXPECT_NEAR(m.exposed_exchange_seconds, want, want * 1e-12) << n << " GPUs";
    EXPECT_NEAR(m.step_seconds, 1e4 + 1.0 + want, 1e-9);
    EXPECT_NEAR(m.tokens_per_second, n * tokens / m.step_seconds, 1e-9);
  }
}

TEST(MultiGpuPlan, NoComputeExposesEveryExchange) {
  const ModelConfig cfg = model_preset("llama3-8b");
  const ModelLayout l = ModelLayout::build(cfg);
  const double tokens = 1000, link = gpu_link_bytes_per_s(GpuLink::pcie);
  MultiGpuRequest req;
  req.gpus = 2;
  req.link = GpuLink::pcie;
  const MultiGpuPlan m = predict_multi_gpu(cfg, synthetic(0.0), tokens, 1000, 1000, req);
  double layers = 0;
  for (int k = 0; k < l.n_layers; ++k) layers += double(l.layer(k).numel);
  const double head = double(cfg.vocab_size) * cfg.hidden_size + double(l.head().numel);
  const double want = 4.0 * (layers + head) / 2 / link + 4.0 * tokens * cfg.hidden_size / link;
  EXPECT_NEAR(m.exposed_exchange_seconds, want, want * 1e-12);  // reordered double sums
}

TEST(MultiGpuPlan, LayersUpdatedOnEveryGpuNeedAnAllReduce) {
  const ModelConfig cfg = model_preset("llama3-8b");
  MultiGpuRequest req;
  req.gpus = 2;
  const MultiGpuPlan host = predict_multi_gpu(cfg, synthetic(1e4, 0), 0, 1000, 1000, req);
  const MultiGpuPlan dev = predict_multi_gpu(cfg, synthetic(1e4, 1), 0, 1000, 1000, req);
  // Only layer 0's exchange is exposed here: twice the bytes with its AdamW on the device.
  EXPECT_NEAR(dev.exposed_exchange_seconds, 2 * host.exposed_exchange_seconds, host.exposed_exchange_seconds * 1e-12);
}

TEST(MultiGpuPlan, RefusesWhatDoesNotFitNamingTheFlag) {
  const ModelConfig cfg = model_preset("llama3-8b");
  MultiGpuRequest req;
  req.gpus = 4;
  req.nccl_device_bytes = 100;
  const MultiGpuPlan host = predict_multi_gpu(cfg, synthetic(1.0), 1000, 100 + 4 * 10 - 1, 1000, req);
  EXPECT_FALSE(host.fits);
  EXPECT_NE(host.advice.find("--host-memory"), std::string::npos) << host.advice;
  EXPECT_TRUE(predict_multi_gpu(cfg, synthetic(1.0), 1000, 100 + 4 * 10, 1000, req).fits) << "exactly enough";
  const MultiGpuPlan dev = predict_multi_gpu(cfg, synthetic(1.0), 1000, 1000, 5 + 100 - 1, req);
  EXPECT_FALSE(dev.fits);
  EXPECT_NE(dev.advice.find("--gpu-memory"), std::string::npos) << dev.advice;
}

TEST(MultiGpuPlan, EachRanksHostShareLeavesRoomForOneSharedCopy) {
  const Plan p = synthetic(1.0);  // 100 shared, 10 per rank
  EXPECT_EQ(rank_host_budget(p, 500, 4), 100u + 400u / 4);
  EXPECT_EQ(rank_host_budget(p, 500, 1), 500u);
  EXPECT_EQ(rank_host_budget(p, 99, 2), 0u) << "the shared copy alone does not fit";
}

TEST(MultiGpuPlan, ParsesTheLink) {
  EXPECT_EQ(parse_gpu_link("nvlink"), GpuLink::nvlink);
  EXPECT_EQ(parse_gpu_link("pcie"), GpuLink::pcie);
  try {
    parse_gpu_link("NVLink4");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-link \"NVLink4\""), std::string::npos) << e.what();
  }
  EXPECT_GT(gpu_link_bytes_per_s(GpuLink::nvlink), gpu_link_bytes_per_s(GpuLink::pcie));
}

}  // namespace
}  // namespace sf
