#!/usr/bin/env bash
# Runs the GPU test suite and the CUDA kernel benchmarks in one go, on a machine with a GPU.
#
# Usage: scripts/gpu.sh check [build-dir]      (default: build-cuda, else build)
#   SF_GPU_CHECK_QUICK=1   shorter benchmark runs
#   OUT=dir                where logs go (default: ./gpu_check_out)
#   SF_COMMIT=hash         the commit to print when the tree has no .git
# The test binaries are run directly (not through ctest: a build directory copied to another
# machine keeps absolute paths in its CTest files). test_cuda first, then every other
# test_<area> binary found (the rest of the suite, which must pass on a GPU machine too), then
# bench_cuda_kernels and, when python3 has torch, bench/torch_ref.py.
# Logs: $OUT/summary.txt (the table printed last), test_cuda.log, tests_other.log,
# bench.log, bench.csv, torch.log, layer.log, layer_profile.log, gpu.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-}
if [ -z "$BUILD" ]; then
  if [ -d build-cuda ]; then BUILD=build-cuda; else BUILD=build; fi
fi
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

say() { echo "$*" >> "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  > "$OUT/gpu.txt" 2>&1 || echo "nvidia-smi failed" > "$OUT/gpu.txt"
say "gpu: $(tail -n +2 "$OUT/gpu.txt" | head -1)"
# A copied working tree may have no .git: SF_COMMIT names the commit then.
say "commit: ${SF_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

# ---- tests ------------------------------------------------------------------------------------
# The GPU machine reaches no network, and the real model's GGUF (98 MB) is more than a carry
# holds: its test runs in CI and on the dev box (scripts/fetch_test_model.sh), skipped here.
export SF_SKIP_REAL_MODEL=${SF_SKIP_REAL_MODEL:-1}
status=0
run_tests() {  # binary log
  local bin=$1 log=$2
  if [ ! -x "$bin" ]; then
    say "$(basename "$bin"): not built"
    return
  fi
  timeout "${SF_TEST_TIMEOUT:-400}" "$bin" --gtest_color=no >> "$log" 2>&1
  local rc=$?
  local passed failed skipped
  passed=$(grep -c '^\[       OK \]' "$log" || true)
  failed=$(grep -c '^\[  FAILED  \].*(' "$log" || true)
  skipped=$(grep -c '^\[  SKIPPED \].*(' "$log" || true)
  say "$(printf '%-16s rc %-3s passed %-4s failed %-4s skipped %s' "$(basename "$bin")" "$rc" "$passed" "$failed" "$skipped")"
  [ "$rc" -ne 0 ] && status=1
}

: > "$OUT/test_cuda.log"
run_tests "$BUILD/tests/test_cuda" "$OUT/test_cuda.log"
: > "$OUT/tests_other.log"
for t in "$BUILD"/tests/test_*; do
  [ "$(basename "$t")" = test_cuda ] && continue
  [ -x "$t" ] || continue
  run_tests "$t" "$OUT/tests_other.log"
done
grep -h '^\[  FAILED  \].*(' "$OUT/test_cuda.log" "$OUT/tests_other.log" >> "$SUMMARY"

say ""
say "---- measured errors (GPU vs host reference) ----"
grep '^\[ERR\]' "$OUT/test_cuda.log" | sed 's/^\[ERR\] //' >> "$SUMMARY"
grep -c '^\[ERR\]' "$OUT/test_cuda.log" | sed 's/^/checks: /' >> "$SUMMARY"

# ---- benchmarks -------------------------------------------------------------------------------
BENCH="$BUILD/bin/bench_cuda_kernels"
if [ -x "$BENCH" ]; then
  args=(--csv "$OUT/bench.csv")
  [ -n "${SF_GPU_CHECK_QUICK:-}" ] && args+=(--quick)
  timeout "${SF_BENCH_TIMEOUT:-300}" "$BENCH" "${args[@]}" > "$OUT/bench.log" 2>&1 || status=1
else
  echo "bench_cuda_kernels not built" > "$OUT/bench.log"
fi
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  PYTHONUNBUFFERED=1 timeout "${SF_BENCH_TIMEOUT:-300}" python3 bench/torch_ref.py > "$OUT/torch.log" 2>&1 || status=1
else
  echo "no python3 with CUDA torch" > "$OUT/torch.log"
fi

# One decoder layer vs transformers' LlamaDecoderLayer (with and without our recompute).
LAYER="$BUILD/bin/bench_cuda_layer"
if [ -x "$LAYER" ]; then
  mkdir -p "$OUT/layer_dump"
  timeout "${SF_BENCH_TIMEOUT:-300}" "$LAYER" --dump "$OUT/layer_dump" > "$OUT/layer.log" 2>&1 || status=1
  read -r f b < <(awk '/^layer_ms /{print $3, $5}' "$OUT/layer.log")
  if [ -n "${f:-}" ] && python3 -c 'import transformers' 2>/dev/null; then
    timeout "${SF_BENCH_TIMEOUT:-300}" python3 bench/torch_layer_ref.py "$OUT/layer_dump" \
      --ours-ms "$f" "$b" >> "$OUT/layer.log" 2>&1 || status=1
  fi
  rm -rf "$OUT/layer_dump"
  # Where a layer's time goes at the engine's batch-32 shape (32 x 1024 tokens), op by op.
  timeout "${SF_BENCH_TIMEOUT:-300}" "$LAYER" --seq 1024 --tokens 32768 --reps 3 --profile \
    > "$OUT/layer_profile.log" 2>&1 || status=1
else
  echo "bench_cuda_layer not built" > "$OUT/layer.log"
fi

say ""
say "---- one decoder layer ----"
grep -E "^layer|ratio|transformers" "$OUT/layer.log" >> "$SUMMARY"
[ -f "$OUT/layer_profile.log" ] && grep -E "^profile|^  " "$OUT/layer_profile.log" >> "$SUMMARY"
say ""
say "---- slideformer CUDA kernels ----"
sed -n '/^op /,$p' "$OUT/bench.log" >> "$SUMMARY"
grep -E "^lm_head|^bench" "$OUT/bench.log" >> "$SUMMARY"
say ""
say "---- PyTorch, same shapes ----"
grep -E "^torch|Error|error" "$OUT/torch.log" >> "$SUMMARY"
cat "$SUMMARY"
exit $status
