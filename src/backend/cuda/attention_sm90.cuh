// Launchers of the wgmma (sm_90a) attention kernels (attention_sm90.cu), called by
// attention.cu's dispatch on compute capability 9 devices. Arguments checked by the caller;
// the backward expects the delta stash written (attention.cu's delta kernel).
#pragma once
#include <cuda_runtime.h>

#include "backend/backend.h"

namespace sf::cuda::attn {

struct AttnArgs;
void forward_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh);
void backward_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh);
// The one-pass backward with atomic dQ (attention.cuh's launch_attention_backward_atomic):
// expects a.dq_acc zeroed and, for the wgmma form, the delta stash written; ends by writing dq
// from the accumulator. ws: the warp-specialised kernel (attention_sm90_ws_bwd.cu; it writes
// its own lse and delta rows first), else the wgmma dk/dv kernel's atomic form.
void backward_atomic_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh, bool ws);
void backward_ws_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh);
// The warp-specialised forward (attention_sm90_ws.cu): TMA producer warp, mbarrier ring, two
// consumer warpgroups; the same contract as forward_sm90.
void forward_sm90_ws(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh);

}  // namespace sf::cuda::attn
