// One Llama-3.1-8B decoder layer (hidden 4096, 32/8 heads, head_dim 128, FFN 14336, llama3
// RoPE with factor 8) forward and backward on the GPU through the model recipes
// (model/recipes.h), timed, and optionally dumped for bench/torch_layer_ref.py, which runs
// transformers' own LlamaDecoderLayer on the same weights and inputs.
//
// Usage: bench_cuda_layer [--seq L] [--tokens T] [--reps N] [--dump DIR] [--profile] [--gemm-ab]
//   --profile prints the device time of every op of one forward and backward (ProfilingBackend).
//   --gemm-ab times the layer with cuBLASLt's first choices and with GEMM tuning
//     (SF_GEMM_TUNE's) alternately, three rounds in one process: an A/B no lease can skew.
//   T tokens per call packed as T / L sequences of L (default 16384 = 4 x 4096).
//   --dump DIR writes, from the first (untimed) run with zeroed gradients:
//     meta.txt      T L C and "slot offset rows cols" per parameter of the layer unit;
//     w.bf16        the layer's flat bf16 weights;  inv_freq.f32  RoPE inverse frequencies;
//     x.bf16, dy.bf16 (inputs), y.bf16, dx.bf16 (outputs), g.f32 (flat weight gradients).
// Timing (CUDA events, median of reps after warm-up): forward = layer_forward; backward =
// layer_backward, which recomputes the forward from x first (the engine keeps only layer
// inputs), then backpropagates. Weight gradients accumulate across reps (timing only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/profiling_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/device_batch.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "model/param_layout.h"
#include "model/recipes.h"

namespace sf {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_layer: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!f) {
    std::fprintf(stderr, "bench_cuda_layer: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::vector<unsigned char> download(Backend& be, Stream& s, const void* p, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  be.copy_to_host(s, h.data(), p, bytes);
  s.synchronize();
  return h;
}

int run(int argc, char** argv) {
  int64_t L = 4096, T = 16384;
  int reps = 10;
  std::string dump;
  bool profile = false, gemm_ab = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seq") && i + 1 < argc) L = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
    else if (!std::strcmp(argv[i], "--profile")) profile = true;
    else if (!std::strcmp(argv[i], "--gemm-ab")) gemm_ab = true;
  }
  if (CudaBackend::device_count() == 0) {
    std::printf("bench_cuda_layer: no CUDA device, nothing to measure\n");
    return 0;
  }
  SF_REQUIRE(L > 0 && T % L == 0, "bench_cuda_layer: --tokens ", T, " must be a multiple of --seq ", L);
  ModelConfig cfg = model_preset("llama3-8b");
  cfg.rope_scaling.factor = 8.0;  // Llama-3.1-8B (the preset's 32 is Llama-3.2's)
  cfg.num_hidden_layers = 1;
  cfg.max_position_embeddings = 131072;
  const ModelLayout layout = ModelLayout::build(cfg);
  const Unit& unit = layout.layer(0);
  const int64_t C = cfg.hidden_size;

  CudaBackend be(0);
  Stream& s = be.default_stream();

  // Weights: the project's initialiser (normal(0, 0.02) matrices, norms 1 + normal(0, 0.2)).
  std::vector<float> wf(size_t(unit.numel));
  InitOptions opt;
  opt.norm_jitter = 0.2f;
  init_unit(unit, wf.data(), 42, opt);
  std::vector<unsigned char> wh(wf.size() * 2);
  convert_from_f32(wf.data(), wh.data(), DType::bf16, wf.size());
  wf.clear();
  wf.shrink_to_fit();
  auto wbuf = be.alloc(wh.size(), "layer weights");
  auto gbuf = be.alloc(size_t(unit.numel) * 4, "layer grads");
  be.copy_to_device(s, wbuf->data(), wh.data(), wh.size());
  be.fill_zero(s, gbuf->data(), gbuf->bytes());
  const LayerWeights w = bind_layer(unit, wbuf->data(), DType::bf16);
  const LayerGrads g = bind_layer(unit, gbuf->data(), DType::f32);

  // Inputs: x ~ uniform(-1.7, 1.7) (unit variance), dy ~ uniform(-1, 1), bf16.
  std::mt19937 rng(7);
  auto rand_bf16 = [&](size_t n, float a) {
    std::uniform_real_distribution<float> d(-a, a);
    std::vector<float> f(n);
    for (auto& v : f) v = d(rng);
    std::vector<unsigned char> h(n * 2);
    convert_from_f32(f.data(), h.data(), DType::bf16, n);
    return h;
  };
  const auto xh = rand_bf16(size_t(T * C), 1.7f), dyh = rand_bf16(size_t(T * C), 1.f);
  auto xb = be.alloc(xh.size(), "x"), dyb = be.alloc(xh.size(), "dy"), yb = be.alloc(xh.size(), "y"),
       dxo = be.alloc(xh.size(), "dx_out"), dxi = be.alloc(xh.size(), "dx_in");
  be.copy_to_device(s, xb->data(), xh.data(), xh.size());
  be.copy_to_device(s, dyb->data(), dyh.data(), dyh.size());
  const Mat x(xb->data(), DType::bf16, T, C), y(yb->data(), DType::bf16, T, C),
      dx_out(dxo->data(), DType::bf16, T, C), dx_in(dxi->data(), DType::bf16, T, C);

  std::vector<std::vector<int32_t>> rows(size_t(T / L), std::vector<int32_t>(size_t(L)));
  for (auto& r : rows)
    for (auto& t : r) t = int32_t(rng() % uint32_t(cfg.vocab_size));
  const Batch batch = Batch::from_rows(rows);
  DeviceBatch db(be, s, cfg, T);
  const BatchInputs& in = db.upload(s, batch);

  const size_t acts_bytes = layer_acts_bytes(cfg, T, DType::bf16);
  auto abuf = be.alloc(acts_bytes, "layer acts");
  const LayerActs acts = bind_layer_acts(cfg, T, DType::bf16, abuf->data(), acts_bytes);

  auto fwd = [&] { layer_forward(be, s, cfg, w, acts, in, x, y); };
  auto bwd_prep = [&] { be.copy_on_device(s, dxo->data(), dyb->data(), dyh.size()); };
  auto bwd = [&] { layer_backward(be, s, cfg, w, g, acts, in, x, dx_out, dx_in); };

  // First run: the one that is dumped (gradients start from zero).
  fwd();
  bwd_prep();
  bwd();
  s.synchronize();
  check(cudaGetLastError(), "first run");
  if (!dump.empty()) {
    std::ofstream meta(dump + "/meta.txt");
    meta << T << " " << L << " " << C << "\n";
    for (const ParamSlot& p : unit.params)
      meta << param_kind_name(p.kind) << " " << p.offset << " " << p.rows << " " << p.cols << "\n";
    write_file(dump + "/w.bf16", wh.data(), wh.size());
    const auto inv = rope_inv_freq(cfg);
    write_file(dump + "/inv_freq.f32", inv.data(), inv.size() * 4);
    write_file(dump + "/x.bf16", xh.data(), xh.size());
    write_file(dump + "/dy.bf16", dyh.data(), dyh.size());
    write_file(dump + "/y.bf16", download(be, s, yb->data(), xh.size()).data(), xh.size());
    write_file(dump + "/dx.bf16", download(be, s, dxi->data(), xh.size()).data(), xh.size());
    write_file(dump + "/g.f32", download(be, s, gbuf->data(), gbuf->bytes()).data(), gbuf->bytes());
    std::printf("bench_cuda_layer: dumped to %s\n", dump.c_str());
  }

  cudaStream_t raw = CudaBackend::cuda_stream(s);
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  auto median_ms = [&](const std::function<void()>& prep, const std::function<void()>& fn) {
    std::vector<float> t;
    for (int i = 0; i < reps + 2; ++i) {
      prep();
      check(cudaEventRecord(a, raw), "record");
      fn();
      check(cudaEventRecord(b, raw), "record");
      check(cudaEventSynchronize(b), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a, b), "elapsed");
      if (i >= 2) t.push_back(ms);  // two warm-up runs
    }
    std::sort(t.begin(), t.end());
    return double(t[t.size() / 2]);
  };
  const double ms_f = median_ms([] {}, fwd);
  const double ms_b = median_ms(bwd_prep, bwd);
  // With kept activations (ReferenceModel's keep_activations): the backward consumes what the
  // forward just left in acts, no recompute.
  auto fwd_then_prep = [&] {
    fwd();
    bwd_prep();
  };
  auto bwd_kept = [&] { layer_backward(be, s, cfg, w, g, acts, in, x, dx_out, dx_in, false); };
  const double ms_bk = median_ms(fwd_then_prep, bwd_kept);
  // Matrix FLOPs of the forward: the four projections plus causal attention (4*D*L^2/2 per
  // head and sequence); the backward does twice the projections and 2.5x the attention.
  const double Q = double(cfg.q_dim()), KV = double(cfg.kv_dim()), F = double(cfg.intermediate_size);
  const double proj = 2.0 * double(T) * C * (Q + 2 * KV + Q + 3 * F);
  const double attn = 4.0 * double(cfg.head_dim) * double(cfg.num_attention_heads) *
                      double(T / L) * double(L) * double(L) / 2.0;
  std::printf("layer llama3.1-8b T %lld (%lld x %lld): forward %.3f ms (%.0f TFLOP/s), "
              "backward incl. recompute %.3f ms, fwd+bwd %.3f ms (%.0f TFLOP/s useful, "
              "recompute not counted)\n",
              (long long)T, (long long)(T / L), (long long)L, ms_f, (proj + attn) / ms_f / 1e9,
              ms_b, ms_f + ms_b, (3.0 * proj + 3.5 * attn) / (ms_f + ms_b) / 1e9);
  std::printf("layer_ms forward %.3f backward %.3f total %.3f\n", ms_f, ms_b, ms_f + ms_b);
  std::printf("layer_ms_kept forward %.3f backward %.3f total %.3f (no recompute)\n", ms_f, ms_bk,
              ms_f + ms_bk);
  if (gemm_ab) {
    // Each switch starts a fresh algorithm cache; median_ms's warm-up calls pick (and, tuned,
    // time) the algorithms before the timed runs.
    std::vector<double> tot[2];
    for (int round = 0; round < 3; ++round)
      for (int tune = 0; tune < 2; ++tune) {
        be.set_gemm_tuning(tune == 1);
        const double f = median_ms([] {}, fwd), bk = median_ms(bwd_prep, bwd);
        tot[tune].push_back(f + bk);
        std::printf("gemm_ab round %d tuning %s: forward %.3f backward %.3f total %.3f ms\n",
                    round, tune ? "on " : "off", f, bk, f + bk);
      }
    for (auto& v : tot) std::sort(v.begin(), v.end());
    std::printf("gemm_ab median total: off %.3f ms, on %.3f ms (%+.2f%%)\n", tot[0][1], tot[1][1],
                100.0 * (tot[1][1] / tot[0][1] - 1));
    be.set_gemm_tuning(false);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (profile) {
    // Per op, one run each (events around every op: a few us of overhead per op).
    ProfilingBackend pb(be);
    auto report = [&](const char* what) {
      const auto lines = pb.take();
      double total = 0;
      for (const auto& l : lines) total += l.seconds;
      std::printf("profile %s: %.3f ms in the ops\n", what, total * 1e3);
      for (const auto& l : lines)
        std::printf("  %-52s %3d x %8.3f ms %5.1f%%\n", l.op.c_str(), l.calls, l.seconds * 1e3,
                    100.0 * l.seconds / std::max(total, 1e-12));
    };
    for (int i = 0; i < 2; ++i) {  // warm-up
      layer_forward(pb, s, cfg, w, acts, in, x, y);
      pb.take();
    }
    layer_forward(pb, s, cfg, w, acts, in, x, y);
    report("forward");
    bwd_prep();
    layer_backward(pb, s, cfg, w, g, acts, in, x, dx_out, dx_in);
    report("backward incl. recompute");
    layer_forward(pb, s, cfg, w, acts, in, x, y);
    bwd_prep();
    pb.take();
    layer_backward(pb, s, cfg, w, g, acts, in, x, dx_out, dx_in, false);
    report("backward, kept activations");
  }
  return 0;
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  try {
    return sf::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_layer: %s\n", e.what());
    return 1;
  }
}
