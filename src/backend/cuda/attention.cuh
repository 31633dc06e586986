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
// SF_ATTN_WS=1: the forward runs the warp-specialised kernel (TMA producer warp, two consumer
// warpgroups; attention_sm90_ws.cu) in place of the wgmma one; 0 or unset: the wgmma one.
// Another value is an Error; so is 1 where the wgmma kernels cannot run, or where cuDNN runs
// attention (cudnn_attention.cpp), since it chooses among slideformer's own kernels.
bool ws_forward_requested();
// Overrides SF_ATTN_WS (tests, A/B benchmarks); returns whether the kernel now runs (only
// where the wgmma kernels do).
bool set_attention_ws_forward(bool on);

void launch_attention_forward(cudaStream_t s, Mat out, float* lse, Mat q, Mat k, Mat v,
                              const AttentionShape& shape, const int32_t* cu_seqlens);
void launch_attention_backward(cudaStream_t s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                               const float* lse, Mat q, Mat k, Mat v,
                               const AttentionShape& shape, const int32_t* cu_seqlens);

}  // namespace sf::cuda
