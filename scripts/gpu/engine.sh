#!/usr/bin/env bash
# The engine's GPU checks and benchmarks in one call (run on the GPU machine):
#   1. the CUDA engine tests (sliding window vs resident step on the GPU),
#   2. transformers loads the model directories slideformer trains and saves (every family x
#      every RoPE type, transformers 5 and 4 spellings) and computes the same loss
#      (scripts/check_hf_configs.sh),
#   3. engine benchmarks: `slideformer bench` on the shapes given in SF_BENCH (one per line:
#      "<size> <layers|0> <batch> <seq> <gpu-memory> [further bench flags]").
# Usage: scripts/gpu.sh engine [build-dir]   Logs under $OUT (default ./gpu_engine_out).
#   SF_COMMIT=hash names the binaries' commit (the copied tree's git may not match them).
#   SF_TRACE_STEPS=1 adds the engine's host timeline to each bench log (stderr).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/bench_shape.sh
B=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu_engine_out}
mkdir -p "$OUT"
S="$OUT/engine_summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
SF="$B/bin/slideformer"
say "commit ${SF_COMMIT:-$(cat "$B/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)}  $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)  $(nproc) cores"

# 1. engine tests on the GPU
timeout 300 "$B/tests/test_cuda" --gtest_filter='*Engine*' > "$OUT/engine_tests.log" 2>&1
say "engine tests rc=$? $(grep -c '^\[       OK' "$OUT/engine_tests.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/engine_tests.log") failed"
grep -E '^\[ERR\]|^\[ENGINE\]' "$OUT/engine_tests.log" | tee -a "$S"

# 2. transformers compatibility of saved model directories: every family x every RoPE type,
#    both config spellings, trained a few steps and saved by slideformer (fp32, 1e-5)
if [ -z "${SF_SKIP_HF:-}" ]; then
  hf_tmp=$(mktemp -d)
  scripts/check_hf_configs.sh "$B" "$hf_tmp" > "$OUT/hf_configs.log" 2>&1
  tail -1 "$OUT/hf_configs.log" | tee -a "$S"
  grep -v "rel diff" "$OUT/hf_configs.log" | grep -v "^check_hf_configs" | head -5 | tee -a "$S"
  rm -rf "$hf_tmp"
fi

# 3. engine benchmarks (issue 4's set by default: 8B at 24 GiB, batch 8/32/64 x 1024 and
#    8 x 8192; the 8-layer cut resident (whole GPU: activations kept; 55 GiB: recomputed, the
#    same kernels as the window) and sliding (24 GiB) at batch 8 and 32)
SF_BENCH=${SF_BENCH:-"llama3-8b 0 8 1024 24GiB
llama3-8b 0 32 1024 24GiB
llama3-8b 0 64 1024 24GiB
llama3-8b 0 8 8192 24GiB
llama3-8b 8 8 1024 130GiB
llama3-8b 8 32 1024 130GiB
llama3-8b 8 32 1024 55GiB
llama3-8b 8 8 1024 24GiB
llama3-8b 8 32 1024 24GiB"}
while read -r size layers batch seq mem extra; do
  [ -z "$size" ] && continue
  log="$OUT/$(bench_shape_name "$size" "$layers" "$batch" "$seq" "$mem" "$extra").log"
  bench_shape "$SF" "$log" "$size" "$layers" "$batch" "$seq" "$mem" "$extra"
  say "bench $size layers=$layers ${batch}x$seq $extra rc=$?: $(grep RESULT "$log" || tail -2 "$log")"
  # Per step: time, tokens/s, norm (clipped above 1.0) and the GPU idle at the boundary.
  grep -E '^step [0-9]' "$log" | sed -E \
    -e 's/^step ([0-9]+) +loss [^ ]+ +gnorm ([^ ]+) +([^ ]+) s +([^ ]+) tok.*before ([^ ]+) s.*/  step \1: \3 s \4 tok\/s gnorm \2 boundary \5 s/' \
    -e 's/^step ([0-9]+) +loss [^ ]+ +gnorm ([^ ]+) +([^ ]+) s +([^ ]+) tok.*/  step \1: \3 s \4 tok\/s gnorm \2/' >> "$S"
done <<< "$SF_BENCH"

# 4. PyTorch FSDP2 with CPU offload, side by side (SF_FSDP2=1): the 8-layer shape at batch 8
#    and 32, and (SF_FSDP2_FULL=1) an attempt at the full 32-layer 8B, which needs ~16 bytes
#    per parameter of host memory (fp32 params, grads, m, v) and should fail on a 125 GiB host.
if [ -n "${SF_FSDP2:-}" ]; then
  runs=${SF_FSDP2_RUNS:-"8 8
8 32"}
  [ -n "${SF_FSDP2_FULL:-}" ] && runs="$runs
32 8"
  while read -r layers batch; do
    [ -z "$layers" ] && continue
    log="$OUT/fsdp2_${layers}_${batch}x1024.log"
    NCCL_NVLS_ENABLE=0 timeout "${SF_BENCH_TIMEOUT:-420}" torchrun --nproc_per_node=1 \
      bench/fsdp2_offload.py --layers "$layers" --batch "$batch" --seq 1024 --steps 4 > "$log" 2>&1
    rc=$?
    say "fsdp2 $layers layers ${batch}x1024 rc=$rc: $(grep RESULT "$log" || grep -m1 -i -E 'out of memory|killed|error' "$log" || tail -1 "$log")"
  done <<< "$runs"
fi
