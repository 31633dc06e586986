#!/usr/bin/env bash
# One device call to try a kernel change: B's GPU tests (a gtest filter), the kernels' A/B
# (`gpu.sh ab`) and one decoder layer of each build against transformers' layer.
# On the GPU machine, with two packs carried (SF_PACK_NAME=name scripts/gpu.sh pack commit):
#   scripts/gpu.sh try base new            (pack names in .carry/)
# Env: SF_TRY_FILTER (default 'CudaAttention*'), SF_TRY_ONLY (the benchmark group, default
# attention), SF_AB_ROUNDS (default 2), SF_TRY_LAYER=0 skips the layers. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu_try_out}
mkdir -p "$OUT"
A=$(scripts/gpu.sh unpack "/tmp/sf-$1" "$1") B=$(scripts/gpu.sh unpack "/tmp/sf-$2" "$2")
echo "A = $1 $(cat "$A/COMMIT"), B = $2 $(cat "$B/COMMIT")"
timeout "${SF_TEST_TIMEOUT:-300}" "$B/tests/test_cuda" --gtest_color=no \
  --gtest_filter="${SF_TRY_FILTER:-CudaAttention*}" > "$OUT/test.log" 2>&1
echo "B tests rc $?: $(grep -cE '^\[       OK \]' "$OUT/test.log") passed"
grep -E '^\[  FAILED  \].*\(' "$OUT/test.log"
SF_AB_ROUNDS=${SF_AB_ROUNDS:-2} OUT=/tmp/sf-try-ab scripts/gpu.sh ab "$A" "$B" \
  --only "${SF_TRY_ONLY:-attention}" | tee "$OUT/ab.txt"
[ "${SF_TRY_LAYER:-1}" = 0 ] && exit 0
for X in "$A" "$B" "$A" "$B"; do
  rm -rf /tmp/sf-try-dump && mkdir -p /tmp/sf-try-dump
  log="$OUT/layer_$(basename "$X").log"
  timeout 200 "$X/bin/bench_cuda_layer" --dump /tmp/sf-try-dump >> "$log" 2>&1
  read -r f b < <(awk '/^layer_ms /{print $3, $5}' "$log" | tail -1)
  timeout 200 python3 bench/torch_layer_ref.py /tmp/sf-try-dump --ours-ms "$f" "$b" >> "$log" 2>&1
  echo "== layer $(cat "$X/COMMIT")"
  grep -E "^layer_ms_kept|^transformers (LlamaDecoderLayer|fastest)" "$log" | tail -5
done
