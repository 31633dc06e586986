// Launcher for attention over a KV cache (attention_decode.cu), the generation path:
// causal GQA of the q_len newest tokens of one sequence over cache rows [0, kv_len), new token
// i (position kv_len - q_len + i) attending to rows [0, kv_len - q_len + i]. bf16 q, cache and
// out ([rows, heads*D] views with any row stride), f32 softmax; head_dim 32, 64, 128 or 256.
// out [q_len, Hq*D] (overwrite). Query head h reads kv head h / (Hq / Hkv).
// One block per (new token, query head); its warps split the keys, each keeping an online
// softmax (running max, sum, output accumulator), and combine at the end. Decoding reads each
// cached key and value once per query head: for one new token this is a few microseconds
// per layer next to the GEMVs over the weights.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace sf::cuda {

void launch_attention_decode(cudaStream_t s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                             const AttentionShape& shape, int64_t kv_len);

}  // namespace sf::cuda
