// Launchers for causal grouped-query flash attention over packed sequences (attention.cu).
// bf16 q/k/v/out (row-major [T, heads*D] views with any row stride that is a multiple of 8, so
// q/k/v may be column blocks of one fused qkv output), fp32 softmax statistics; head_dim 64 or
// 128. Query head h reads kv head h / (Hq / Hkv); token t of sequence s attends to tokens of s
// up to itself. No [seq x seq] matrix ever reaches global memory.
//   forward : out[T, Hq*D] (overwrite); lse[Hq, T] (f32, overwrite) = log-sum-exp of the scaled
//             scores, which the backward needs.
//   backward: dq, dk, dv (overwrite). Three launches, no atomics (deterministic):
//             1. delta[t, h] = dout . out, stashed as f32 in the first 4*Hq bytes of dq's row t
//                (dq's row has 2*Hq*D >= 4*Hq bytes and is overwritten in step 3 anyway);
//             2. dk, dv: one block per (key tile, kv head), looping over the query heads of the
//                group and the query tiles at or after the key tile;
//             3. dq: one block per (query tile, head), looping over key tiles; it recomputes
//                its own rows' delta, so overwriting the stash is safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace sf::cuda {

// Kernel family: warpgroup MMAs (wgmma, sm_90a) on compute capability 9 devices, in builds with
// sm_90a code (the default SF_CUDA_ARCHS), unless SF_ATTN_WGMMA=0; else mma.sync (sm_80+).
// Both compute the same contract. set_attention_wgmma picks one for the calls that follow
// (tests, A/B benchmarks; no call in flight) and returns whether wgmma is now on (never where
// it cannot run).
bool set_attention_wgmma(bool on);
// Where the wgmma kernels run, the forward is the warp-specialised kernel (TMA producer warp,
// two consumer warpgroups in ping-pong; attention_sm90_ws.cu), 1.2-1.8x the wgmma forward's
// speed; SF_ATTN_WS=0 runs the wgmma forward instead. SF_ATTN_WS=1 insists: an Error where
// the wgmma kernels cannot run, or where cuDNN runs attention (cudnn_attention.cpp), since it
// chooses among slideformer's own kernels. Another value is an Error.
enum class WsForward { by_default, off, required };
WsForward ws_forward_setting();
// Overrides SF_ATTN_WS (tests, A/B benchmarks) with the default (on) or 0; returns whether the
// kernel now runs (only where the wgmma kernels do).
bool set_attention_ws_forward(bool on);

void launch_attention_forward(cudaStream_t s, Mat out, float* lse, Mat q, Mat k, Mat v,
                              const AttentionShape& shape, const int32_t* cu_seqlens);
void launch_attention_backward(cudaStream_t s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                               const float* lse, Mat q, Mat k, Mat v,
                               const AttentionShape& shape, const int32_t* cu_seqlens);

// The backward in one pass with atomic dQ, where the wgmma kernels run
// (attention_backward_atomic_runs): one dk/dv kernel also computes dQ = dS K from the dS it
// already has (5 tensor-core products per tile pair against 7) and adds it into an f32
// accumulator in `workspace` (attention_backward_atomic_workspace_bytes: Hq x (T + 64 x
// sequences) x D + Hq x T floats, 16-byte aligned; dq_acc_layout.h), then one pass writes dq.
// dk and dv repeat bit for bit; dq's f32 sums arrive in a varying order, so its bits may differ
// from run to run (as cuDNN's fast backward). The pass is the warp-specialised kernel
// (attention_sm90_ws_bwd.cu: a TMA producer warp, a dQ writer warp that bulk-adds each item's
// dQ tile, two consumer warpgroups); set_attention_ws_backward(false) runs the wgmma dk/dv
// kernel's form of it instead (tests, A/B benchmarks) and it returns whether the former now
// runs. Correct on an H100 (CudaAttention.AtomicBackward, memcheck-clean) but 0.54-0.94x of
// cuDNN's backward there (docs/BENCHMARKS.md), so the backend does not call it: only the test
// and bench_cuda_kernels --impl native-atomic / native-atomic-wgmma do.
bool attention_backward_atomic_runs();
bool set_attention_ws_backward(bool on);
size_t attention_backward_atomic_workspace_bytes(int64_t T, const AttentionShape& shape);
void launch_attention_backward_atomic(cudaStream_t s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                      const float* lse, Mat q, Mat k, Mat v,
                                      const AttentionShape& shape, const int32_t* cu_seqlens,
                                      float* workspace, size_t workspace_bytes);

}  // namespace sf::cuda
