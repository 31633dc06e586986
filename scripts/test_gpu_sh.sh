#!/usr/bin/env bash
# Checks scripts/gpu.sh without a GPU: every verb script parses, `help` lists every verb, an
# unknown or missing verb exits 2, engine-ab refuses bad arguments, and engine-ab's
# interleaving, log names and summary on two fake builds whose `slideformer` prints what
# `slideformer bench` prints (src/cli/bench_command.cpp: step lines, then the RESULT line).
# Usage: scripts/test_gpu_sh.sh   (exit 0: all passed)
set -uo pipefail
cd "$(dirname "$0")/.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
check() {  # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }
rc_is() { local want=$1; shift; "$@" > "$T/out" 2> "$T/err"; [ $? -eq "$want" ]; }

for f in scripts/gpu.sh scripts/gpu/*.sh; do check "bash -n $f" bash -n "$f"; done
scripts/gpu.sh help > "$T/help"
for v in pack unpack check engine train-check try ab engine-ab attention-profile; do
  check "help lists $v" grep -qE "^  $v( |$)" "$T/help"
done
check "unknown verb exits 2" rc_is 2 scripts/gpu.sh frobnicate
check "unknown verb is named" has "$T/err" "unknown verb 'frobnicate'"
check "no verb exits 2" rc_is 2 scripts/gpu.sh
check "engine-ab with one argument exits 2" rc_is 2 scripts/gpu.sh engine-ab "$T/a"
check "engine-ab without builds exits 2" rc_is 2 scripts/gpu.sh engine-ab "$T/none1" "$T/none2"
check "... and names the missing binary" has "$T/err" "$T/none1/bin/slideformer"
check "attention-vs-torch with a missing SF_FA3_LIB exits 2" rc_is 2 \
  env SF_FA3_LIB="$T/no.so" scripts/gpu.sh attention-vs-torch "$T/none1"
check "... and names the library" has "$T/err" "SF_FA3_LIB=$T/no.so: no such file"
check "attention-profile with a head dimension of 32 exits 2" rc_is 2 \
  scripts/gpu.sh attention-profile "$T/none1" 32 8192
check "... and names the head dimensions" has "$T/err" "D '32': 64 or 128"
check "attention-profile without a length exits 2" rc_is 2 scripts/gpu.sh attention-profile "$T/none1" 64

# Two fake builds. Each run's numbers: base + 100 * round, B's tokens/s 1% higher; B's second
# round on the 8-layer shape fails without a RESULT line.
for side in a b; do
  mkdir -p "$T/$side/bin"
  echo "commit-$side" > "$T/$side/COMMIT"
  cat > "$T/$side/bin/slideformer" <<FAKE
#!/usr/bin/env bash
side=$side
FAKE
  cat >> "$T/$side/bin/slideformer" <<'FAKE'
args="$*"; layers=$(echo "$args" | sed -E 's/.*--layers ([0-9]+).*/\1/')
n=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 )); echo $n > "$0.count"
echo "args $args"
if [ "$side" = b ] && [ "$layers" = 8 ] && [ $n -eq 3 ]; then echo "CUDA error: out of memory"; exit 1; fi
base=10000; [ "$layers" = 0 ] && base=2000
mul=100; [ "$side" = b ] && mul=101
tps=$(( (base + 100 * n) * mul / 100 ))
echo "setup 3.1 s (sliding window)"
echo "step 1  loss 11.93  gnorm 3.02  2.711 s  12088 tok/s  95.1 TFLOP/s"
echo "step 2  loss 11.91  gnorm 0.98  2.601 s  12598 tok/s  99.2 TFLOP/s  [fwd 0.801 s, bwd 1.700 s]"
echo "RESULT size=llama3-8b layers=$layers batch=32x1024 accum=1 tokens/s=$tps steady_tokens/s=$((tps + 50)) (5 steps) model_TFLOP/s=98.7 peak_gpu_GiB=18.4$n peak_rss_GiB=44.90 gpu_busy=97% predicted_tokens/s=13000 engine=sliding window"
FAKE
  chmod +x "$T/$side/bin/slideformer"
done
check "SF_AB_ROUNDS=0 exits 2" rc_is 2 env SF_AB_ROUNDS=0 scripts/gpu.sh engine-ab "$T/a" "$T/b"
check "a malformed SF_BENCH line exits 2" rc_is 2 env SF_BENCH="llama3-8b 8 32" \
  scripts/gpu.sh engine-ab "$T/a" "$T/b"

OUT="$T/out_ab" SF_BENCH="llama3-8b 8 32 1024 24GiB
llama3-8b 0 32 1024 24GiB --no-grads-stream" scripts/gpu.sh engine-ab "$T/a" "$T/b" > "$T/ab.txt" 2>&1
check "engine-ab exits 0" test $? -eq 0
cat "$T/ab.txt"
L="$T/out_ab"
check "A's runs interleave with B's (A: 4 runs, B: 4)" test "$(cat "$T/a/bin/slideformer.count")" = 4 -a "$(cat "$T/b/bin/slideformer.count")" = 4
check "log names follow gpu.sh engine's" test -f "$L/bench_llama3-8b_8_32x1024_24GiB_A1.log" \
  -a -f "$L/bench_llama3-8b_0_32x1024_24GiB___no_grads_stream_B2.log"
check "the bench flags pass through" has "$L/bench_llama3-8b_0_32x1024_24GiB___no_grads_stream_B2.log" \
  "--batch-size 32 --seq-len 1024 --steps 12 --gpu-memory 24GiB --backend cuda --no-grads-stream"
check "the header names both commits" has "$T/ab.txt" "A = commit-a, B = commit-b, 2 rounds"
check "a failed run is reported" has "$T/ab.txt" "B run 2 of llama3-8b layers=8 32x1024 24GiB failed (rc 1): CUDA error: out of memory"
# A's runs on the 8-layer shape: counts 1 and 3 -> 10100, 10300 (median 10200); B's: count 1
# only -> 10201 (median 10201): +0.01%.
check "tokens/s per run and change" has "$T/ab.txt" "  tokens/s         A 10100 10300  B 10201 -  B vs A +0.01%"
check "steady tokens/s" has "$T/ab.txt" "  steady_tokens/s  A 10150 10350  B 10251 -  B vs A +0.01%"
# peak GPU 18.41 / 18.43 (median 18.42) against 18.41: -0.05%.
check "peak GPU" has "$T/ab.txt" "  peak_gpu_GiB     A 18.41 18.43  B 18.41 -  B vs A -0.05%"
check "peak RSS" has "$T/ab.txt" "  peak_rss_GiB     A 44.90 44.90  B 44.90 -  B vs A +0.00%"
# The full model, counts 2 and 4: A 2200, 2400; B 2222, 2424 (+1.00%).
check "second shape, flags in its label" has "$T/ab.txt" "llama3-8b layers=0 32x1024 24GiB --no-grads-stream"
check "second shape's change" has "$T/ab.txt" "  tokens/s         A 2200 2400  B 2222 2424  B vs A +1.00%"
check "the summary file holds what was printed" cmp -s "$T/ab.txt" "$L/engine_ab_summary.txt"

# gpu.sh engine runs its shapes through the same function (no GPU: its engine tests fail).
OUT="$T/out_engine" SF_SKIP_HF=1 SF_BENCH="llama3-8b 0 32 1024 24GiB --no-grads-stream" \
  scripts/gpu.sh engine "$T/a" > /dev/null 2>&1
check "engine: the shape's log and its RESULT in the summary" has \
  "$T/out_engine/bench_llama3-8b_0_32x1024_24GiB___no_grads_stream.log" "--backend cuda --no-grads-stream"
check "engine: rc and RESULT in the summary" has "$T/out_engine/engine_summary.txt" \
  "bench llama3-8b layers=0 32x1024 --no-grads-stream rc=0: RESULT size=llama3-8b"
check "engine: the step lines" has "$T/out_engine/engine_summary.txt" "  step 2: 2.601 s 12598 tok/s gnorm 0.98"

[ "$fails" -eq 0 ] && echo "all passed" || echo "$fails failed"
[ "$fails" -eq 0 ]
