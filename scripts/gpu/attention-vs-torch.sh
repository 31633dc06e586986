#!/usr/bin/env bash
# scripts/gpu.sh attention-vs-torch BUILD_DIR [64|128]...
# Issue 19's yardstick in one call: slideformer's attention (bench_cuda_kernels, the engine's
# default implementation) against torch's SDPA, interleaved round by round (round 1: ours then
# torch, round 2: torch then ours, ...), so that drift within the lease cannot pass for a gap.
# First one pass of every torch backend (flash, efficient, cuDNN) names torch's fastest per
# row; the rounds then time ours against that backend. Both sides time regions of calls back
# to back (--span-ms), so neither side's host overhead per call is counted, and draw the same
# distributions. Run on the GPU machine with SF_CUDNN_LIB set (torch's cuDNN, as check.sh):
#   scripts/gpu.sh attention-vs-torch "$(scripts/gpu.sh unpack)" 128 64
# Prints, per head dimension and row, the medians over the rounds and the range of the
# per-round ratio (bench/attention_vs_torch.py).
# Env: SF_AB_ROUNDS (default 3), SF_SPAN_MS (default 20), SF_IMPL (default cudnn-nondet: what
#   the engine runs), SF_AB_TIMEOUT (seconds per run, default 300), SF_FA3_LIB (the path of
#   FlashAttention-3's libdew_flash_attn3.so, bench/fa3_jax_ref.py's header says how to carry
#   it): when set, each round also times FA3 through JAX, and the table adds its column.
# After the rounds, one pair with one call per region (--span-ms 0, the host's overhead per
# call counted, as tables before this script timed) for the table's last column.
# Under $OUT (default ./gpu_attention_out): attention_vs_torch.md (what is printed) and
#   attention_vs_torch_logs.tgz holding all_D<d>.log (every torch backend), ours_D<d>_<r>.log,
#   torch_D<d>_<r>.log, fa3_D<d>_<r>.log (with SF_FA3_LIB) and *_D<d>_percall.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
fa3_lib=${SF_FA3_LIB:-}
[ -z "$fa3_lib" ] || [ -f "$fa3_lib" ] ||
  { echo "attention-vs-torch: SF_FA3_LIB=$fa3_lib: no such file (bench/fa3_jax_ref.py's header)" >&2; exit 2; }
. scripts/gpu/attention_args.sh
attention_args attention-vs-torch "$@"
OUT=${OUT:-$PWD/gpu_attention_out}
mkdir -p "$OUT"
span=${SF_SPAN_MS:-20}
impl=${SF_IMPL:-cudnn-nondet}
limit=${SF_AB_TIMEOUT:-300}
export PYTHONUNBUFFERED=1
ours() {  # D round [span]
  timeout "$limit" "$BUILD/bin/bench_cuda_kernels" --quick --only "attention:D$1" \
    --span-ms "${3:-$span}" --impl "$impl" > "$OUT/ours_D$1_$2.log" 2>&1 ||
    echo "ours D$1 round $2 failed: $(tail -1 "$OUT/ours_D$1_$2.log")"
}
theirs() {  # D round span backend...
  local d=$1 r=$2 s=$3 b args=()
  shift 3
  for b in "$@"; do args+=(--backend "$b"); done
  timeout "$limit" python3 bench/torch_attention_ref.py --quick --head-dim "$d" \
    --span-ms "$s" "${args[@]}" > "$OUT/torch_D${d}_$r.log" 2>&1 ||
    echo "torch D$d round $r failed: $(tail -1 "$OUT/torch_D${d}_$r.log")"
}
fa3() {  # D round: FlashAttention-3 through JAX, when SF_FA3_LIB names its library
  [ -n "$fa3_lib" ] || return 0
  timeout "$limit" python3 bench/fa3_jax_ref.py --lib "$fa3_lib" --quick --head-dim "$1" \
    --span-ms "$span" > "$OUT/fa3_D$1_$2.log" 2>&1 ||
    echo "fa3 D$1 round $2 failed: $(tail -1 "$OUT/fa3_D$1_$2.log")"
}
for d in "${dims[@]}"; do
  timeout "$limit" python3 bench/torch_attention_ref.py --quick --head-dim "$d" \
    --span-ms "$span" > "$OUT/all_D$d.log" 2>&1 || echo "torch D$d all backends failed"
  best=$(python3 bench/attention_vs_torch.py --fastest "$OUT/all_D$d.log")
  echo "D $d: torch's fastest backend at some row: $best"
  for r in $(seq "${SF_AB_ROUNDS:-3}"); do
    if [ $((r % 2)) -eq 1 ]; then ours "$d" "$r"; theirs "$d" "$r" "$span" $best; fa3 "$d" "$r"
    else fa3 "$d" "$r"; theirs "$d" "$r" "$span" $best; ours "$d" "$r"; fi
  done
  # One more pair timing one call per region, as the earlier tables did (host overhead counted).
  ours "$d" percall 0
  theirs "$d" percall 0 $best
done
echo "ours: $(cat "$BUILD/COMMIT" 2>/dev/null || echo "$BUILD") $impl, span $span ms"
python3 bench/attention_vs_torch.py "$OUT" | tee "$OUT/attention_vs_torch.md"
# The device call returns at most 8 files: the logs travel as one archive.
(cd "$OUT" && tar czf attention_vs_torch_logs.tgz all_D*.log ours_D*.log torch_D*.log \
  $(ls fa3_D*.log 2>/dev/null) && rm -f all_D*.log ours_D*.log torch_D*.log fa3_D*.log)
