// cuDNN fused flash attention (cuDNN's backend graph API, no frontend library) as a second
// implementation of the attention contract in attention.cuh: causal GQA over packed sequences,
// bf16 q/k/v/out with row strides, f32 lse [Hq, T] (natural log), dq/dk/dv overwritten.
//
// The graph is the SDPA pattern cuDNN's fused engines match (matmul, scale, padding and causal
// masks, softmax with stats, matmul; and the backward's mirror), over the packed ("THD",
// ragged-offset) layout: sequence b of a bucket of B is rows cu[b] .. cu[b+1] of each tensor,
// reached through a per-tensor ragged offset cu[b] * ld; seq_len[b] drives the padding mask;
// the causal mask is top-left per sequence (q and kv lengths are equal). Sequences past n_seqs
// in the bucket have length 0. A call whose sequences all fill the length bucket runs the dense
// form instead (cudnn_dense_graphs below): no offsets, lengths or padding mask, batch n_seqs.
//
// A call runs in parts of consecutive sequences whose padded rows fit in its tokens (the
// workspace then grows with the tokens, as the planner counts it, not with sequences x longest).
// Given the host's lengths (AttentionShape::host_cu_seqlens), each part is padded to its own
// longest, and a long sequence that fills its bucket runs alone on the dense graph; without
// them, parts of equal count are padded to the call's longest.
//
// Plans are cached: a graph fixes the direction, the sequence-count bucket B, the max-length
// bucket S, the heads, head_dim and every row stride, so one plan serves every batch in its
// bucket. Per-call data (seq_len, ragged offsets, the padded softmax statistics) are written by
// small kernels from cu_seqlens on the stream: no host sync.
//
// Workspace (caller's device memory, cudnn_attention_workspace_bytes for a call, 256-byte
// aligned): seq_len and offsets, the padded [B, Hq, S] f32 statistics (forward: cuDNN writes
// them, a kernel scatters them into lse; backward: a kernel gathers lse into them), and in the
// backward the padded [B, Hq, S] softmax-sum and (non-deterministic form) the [B, Hq, S, D]
// f32 dQ accumulator, then the plan's own workspace (at most 2 GiB, else the shape is refused).
//
// Where cuDNN builds no plan for a shape (no engine, a refused attribute), the run functions
// return false and the caller uses its own kernels; the first refusal of each kind prints one
// line on stderr naming the failing descriptor and attribute with cuDNN's message.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace sf::cuda {

// Which kernels run attention: slideformer's (native), cuDNN's fused ones (cudnn), or
// slideformer's forward with cuDNN's backward (split: both keep lse [Hq, T] in natural log, so
// either backward takes either forward's statistics).
enum class AttentionImpl { native, cudnn, split };
const char* attention_impl_name(AttentionImpl impl);
// Whether `impl` sends a forward (backward = false) or a backward call to cuDNN.
constexpr bool cudnn_runs_pass(AttentionImpl impl, bool backward) {
  return impl == AttentionImpl::cudnn || (impl == AttentionImpl::split && backward);
}

// Whether the cuDNN path can run here: device 0 has compute capability 9.x, the build has
// cuDNN >= 9.6 headers and cuDNN 9.x >= 9.6 loads at run time (cudnn_library.h: int64 ragged
// offsets and the un-zeroed dQ accumulator need 9.6). Decided once, on the first call; where
// only the library is missing, one note on stderr (not under SF_ATTN=cudnn: that is an Error).
// Throws Error where SF_CUDNN_LIB names a library that cannot be used.
bool cudnn_attention_available();
// Why not ("" where available): the device, the build or the library, with the fix.
std::string cudnn_attention_unavailable_reason();

// The implementation the calls that follow use. The default: SF_ATTN=native|cudnn|split if set
// (another value is an Error; cudnn or split where cuDNN is unavailable is an Error saying
// why), else cudnn where available, else native. attention_impl_setting() reads SF_ATTN anew
// (attention_impl() reads it once). set_attention_impl is for tests and A/B benchmarks (no call
// in flight); it returns the implementation now in effect (native where cudnn or split was
// asked for but cuDNN is unavailable).
AttentionImpl attention_impl_setting();
AttentionImpl attention_impl();
AttentionImpl set_attention_impl(AttentionImpl impl);

// Whether attention backwards must give the same bits on every call. Off by default: cuDNN's
// backward that accumulates dQ with atomics is the fastest on Hopper (1.6-1.7x our kernels'
// from 4K on, docs/BENCHMARKS.md), and its sums differ in the last bits from run to run. On
// (SF_ATTN_DETERMINISTIC=1; another value is an Error), runs repeat bit for bit, as the bitwise
// GPU tests need (test_cuda turns it on for all but the tests of the fast form): the cuDNN
// backward runs the graph form without the f32 dQ accumulator and only on an engine cuDNN does
// not mark non-deterministic; where it has none (from 2K tokens per sequence on the H200: its
// workspace grows past 2 GiB), our kernels run the backward. The forward is deterministic
// either way; our kernels always are.
bool attention_deterministic();
void set_attention_deterministic(bool on);

// Whether a call whose sequences all fill their length bucket (a power of two, or 1.5 times
// one, from 64 tokens; one sequence, or n of them in n * S rows) runs cuDNN's dense graph: no
// ragged offsets, no sequence lengths, no padding mask, as PyTorch's dense SDPA builds it; the
// packed graph otherwise. On by default: on the H200 it is 3-13% faster than the packed graph
// for one sequence of 16K-128K (docs/BENCHMARKS.md, bench_cuda_kernels' cudnn-nondet-packed
// rows). SF_CUDNN_DENSE=0 turns it off (another value than 0 or 1 is an Error); the setter is
// for tests and A/B benchmarks. Its accuracy test: tests/cuda/test_cuda_cudnn_attention.cpp.
bool cudnn_dense_graphs();
void set_cudnn_dense_graphs(bool on);

// How a packed part's sequence-count bucket B is chosen (the dense graph's B is always its
// sequences). by_count: the bucket of the part's sequences, the fewest padded rows. by_tokens:
// the largest bucket with B x S <= the call's tokens, so that one graph serves every part of
// length bucket S whatever its count: fewer plans to build over a run of varied batches (cuDNN
// builds one per graph, tens of ms to seconds each), more empty sequences per call. Neither pads
// past the call's tokens (but a lone sequence's own bucket), the workspace the planner counts.
// by_count is the default: on the H200
// (docs/BENCHMARKS.md) by_tokens halved the plans a stream of 16 packed 8 x 8192 batches built
// (16 against 32; about 70 ms each) but ran 0.6-2.4% slower once they were built, which a run
// of an hour pays more than the seconds of plans it saves. The setter is for tests and A/B
// benchmarks.
enum class PackedBatch { by_count, by_tokens };
PackedBatch cudnn_packed_batch();
void set_cudnn_packed_batch(PackedBatch p);

// One attention call, as the launchers in attention.cuh take it. The backward fills the d*
// views and dout; the forward leaves them empty.
struct CudnnAttentionCall {
  Mat q, k, v, out;
  float* lse = nullptr;
  Mat dq, dk, dv, dout;
  const int32_t* cu_seqlens = nullptr;  // device, n_seqs + 1
  AttentionShape shape;
  bool backward = false;
};

// Device bytes this call needs (builds or fetches its plan: the plan's workspace is part of
// it). 0 when the cuDNN path would refuse the call (the caller's kernels then run).
size_t cudnn_attention_workspace_bytes(const CudnnAttentionCall& call);

// The same from a shape and the row strides alone (a planner's question: no tensors needed).
struct AttentionStrides {
  int64_t q = 0, k = 0, v = 0, out = 0;       // both directions
  int64_t dout = 0, dq = 0, dk = 0, dv = 0;  // the backward's
};
size_t cudnn_attention_workspace_bytes(const AttentionShape& shape, const AttentionStrides& ld,
                                       bool backward);

// Runs the call on stream s with workspace [ws, ws + ws_bytes). Returns false (nothing
// enqueued) where cuDNN has no plan for the shape. Throws Error(cuda) when an execution fails
// and Error(input) when ws_bytes is below cudnn_attention_workspace_bytes(call).
bool cudnn_attention_run(cudaStream_t s, const CudnnAttentionCall& call, void* ws,
                         size_t ws_bytes);

// For tests and the smoke check: plans built so far (a second call in the same bucket must not
// add one), executions, and a description of the plan a call uses (engine global index,
// workspace, buckets) or why there is none.
struct CudnnAttentionStats {
  int64_t plans_built = 0;
  int64_t plans_refused = 0;
  int64_t executions = 0;
  int64_t dense_executions = 0;  // of those, through a dense graph (cudnn_dense_graphs)
  double plan_build_seconds = 0;  // wall time spent building plans (and refusals)
};
CudnnAttentionStats cudnn_attention_stats();
// For a run's summary: "cuDNN built 32 attention plans in 6.4 s (...)", "" when none was built.
std::string describe_plan_building(const CudnnAttentionStats& st);

// Whether this build has the cuDNN path (cuDNN >= 9.6 headers; the library loads at run time),
// and a check that needs no device: builds and finalizes the call's operation graph (its
// bucket; the data pointers are never read) and returns "" or what cuDNN refused (or why the
// library is not loaded). The engine choice still needs the GPU.
bool cudnn_attention_built();
std::string cudnn_attention_graph_check(const CudnnAttentionCall& call);
std::string cudnn_attention_plan_info(const CudnnAttentionCall& call);

}  // namespace sf::cuda
