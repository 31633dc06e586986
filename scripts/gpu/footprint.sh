#!/usr/bin/env bash
# The footprint checks in one call (run on the GPU machine), issue "train wherever SlideFormer
# trains, in its memory or less":
#   1. the CUDA engine and decode tests (sliding window vs resident and vs host copies, the
#      KV-cache decoder vs the host's),
#   2. `slideformer bench` of the 8B shape at SlideFormer's footprints (--gpu-memory and
#      --host-memory as its measured peaks), clipping off (SlideFormer does not clip) and on,
#      and at --gpu-memory 24GiB for the rows of the earlier table,
#   3. decode tokens/s of `slideformer generate` against transformers' generate (bf16, the
#      same random-weight model directory, made here by `slideformer init`).
#   4. (mode `memory`, alone: ~8 min, one device call) flat memory over a long run, issue 17:
#      `slideformer bench` of the 8-layer cut, 8 x 1024, --gpu-memory 24GiB, SF_MEM_STEPS
#      (default 1000) steps, RSS and GPU bytes sampled after every step into
#      $OUT/mem-8layer.csv; its "memory:" summary line and the docs row go to the summary.
# Usage: scripts/gpu.sh footprint [build-dir] [memory]   Logs under $OUT (default
#   ./gpu_footprint_out). scripts/gpu.sh footprint - mem-row CSV prints the docs row of a
#   memory CSV (anywhere, no GPU).
#   SF_FOOTPRINT: the bench rows (engine.sh's SF_BENCH format); SF_SKIP_TESTS=1 skips 1,
#   SF_SKIP_DECODE=1 skips 3 (the device tool's 600 s per call: split the table over calls).
set -uo pipefail
cd "$(dirname "$0")/../.."

# mem_row CSV: the docs row of a memory log (bench --memory-log: step, rss_bytes,
# peak_rss_bytes, gpu_bytes, plan_host_bytes, plan_device_bytes, gpu_used_bytes; row 0 is
# before the engine). Growth: the most a sample after step 10 exceeds step 10's; GPU: the
# backend's bytes (what the plan counts), "driver" the device's as cudaMemGetInfo counts them.
mem_row() {
  awk -F, 'NR == 1 { next }
    { step = $1; if ($3 > hwm) hwm = $3; if ($4 > gmax) gmax = $4; if ($7 > umax) umax = $7
      ph = $5; pd = $6; if (step == 0) base = $2
      if (step == 10) { r10 = $2; g10 = $4 }
      if (step > 10) { if ($2 - r10 > rg) rg = $2 - r10; if ($4 - g10 > gg) gg = $4 - g10 } }
    END {
      G = 1024 * 1024 * 1024; M = 1024 * 1024
      print "| steps | RSS before the engine | peak RSS (plan host) | RSS growth after step 10 | GPU in use, max sampled (plan device) | GPU growth after step 10 | driver-counted GPU, max |"
      print "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      printf "| %d | %.2f GiB | %.2f GiB (%.2f) | %.1f MiB | %.2f GiB (%.2f) | %.1f MiB | %.2f GiB |\n",
        step, base / G, hwm / G, ph / G, rg / M, gmax / G, pd / G, gg / M, umax / G }' "$1"
}

if [ "${2:-}" = mem-row ]; then
  mem_row "${3:?usage: scripts/gpu.sh footprint - mem-row CSV}"
  exit
fi
. scripts/gpu/bench_shape.sh
B=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu_footprint_out}
mkdir -p "$OUT"
S="$OUT/footprint_summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
SF="$B/bin/slideformer"
say "commit $(cat "$B/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)  $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)  $(nproc) cores  $(free -g | awk '/Mem/{print $2}') GiB RAM"

# 4. alone: the long run fills a device call by itself (~0.45 s per step at 8 x 1024).
if [ "${2:-}" = memory ]; then
  csv="$OUT/mem-8layer.csv"
  log="$OUT/mem-8layer.log"
  timeout 570 "$SF" bench --size llama3-8b --layers 8 --batch-size 8 --seq-len 1024 \
    --steps "${SF_MEM_STEPS:-1000}" --gpu-memory 24GiB --backend cuda --memory-log "$csv" > "$log" 2>&1
  say "bench llama3-8b 8 layers 8x1024 24GiB ${SF_MEM_STEPS:-1000} steps rc=$?: $(grep RESULT "$log" || tail -1 "$log")"
  grep '^memory:' "$log" | tee -a "$S"
  [ -s "$csv" ] && mem_row "$csv" | tee -a "$S"  # a run cut short still leaves its rows
  exit 0
fi

if [ -z "${SF_SKIP_TESTS:-}" ]; then
  timeout 420 "$B/tests/test_cuda" --gtest_filter='*Engine*:*Decode*:*Decoder*' > "$OUT/tests.log" 2>&1
  say "engine + decode tests rc=$? $(grep -c '^\[       OK' "$OUT/tests.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/tests.log") failed"
  grep -E '^\[  FAILED|^\[ENGINE\] from' "$OUT/tests.log" | tee -a "$S"
fi

SF_FOOTPRINT=${SF_FOOTPRINT:-"llama3-8b 0 8 1024 6GiB --host-memory 96GiB --max-grad-norm 0
llama3-8b 0 32 1024 11GiB --host-memory 102GiB --max-grad-norm 0
llama3-8b 0 1 32768 11GiB --host-memory 102GiB --max-grad-norm 0
llama3-8b 0 1 65536 17GiB --host-memory 110GiB --max-grad-norm 0
llama3-8b 0 8 1024 6GiB --host-memory 96GiB
llama3-8b 0 8 1024 24GiB --max-grad-norm 0
llama3-8b 0 32 1024 24GiB --max-grad-norm 0
llama3-8b 0 8 1024 24GiB
llama3-8b 0 32 1024 24GiB"}
while read -r size layers batch seq mem extra; do
  [ -z "$size" ] && continue
  log="$OUT/$(bench_shape_name "$size" "$layers" "$batch" "$seq" "$mem" "$extra").log"
  SF_BENCH_STEPS=${SF_BENCH_STEPS:-8} bench_shape "$SF" "$log" "$size" "$layers" "$batch" "$seq" "$mem" "$extra"
  say "bench $size ${batch}x$seq $mem $extra rc=$?: $(grep RESULT "$log" || grep -m1 -E 'error|fits' "$log" || tail -1 "$log")"
  grep -m1 '^mode' "$log" >> "$S"
done <<< "$SF_FOOTPRINT"

if [ -z "${SF_SKIP_DECODE:-}" ]; then
  m=$(mktemp -d)/model
  "$SF" init --size llama3-1b --tokenizer tests/data/tokenizers/gpt2 --dtype bf16 --out "$m" > "$OUT/init.log" 2>&1
  prompt="The history of the city begins"
  for w in resident streamed; do
    timeout 300 "$SF" generate --model "$m" --prompt "$prompt" --max-new-tokens 256 --backend cuda \
      --weights "$w" > "$OUT/generate_$w.log" 2>&1
    say "slideformer generate ($w weights) rc=$?: $(tail -1 "$OUT/generate_$w.log")"
  done
  timeout 300 python3 scripts/bench_generate.py --model "$m" --prompt "$prompt" --new 256 > "$OUT/hf_generate.log" 2>&1
  say "transformers generate rc=$?: $(tail -1 "$OUT/hf_generate.log")"
fi
