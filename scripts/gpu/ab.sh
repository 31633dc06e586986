#!/usr/bin/env bash
# scripts/gpu.sh ab A_DIR B_DIR [bench_cuda_kernels flags]
# A/B of two builds' kernel benchmarks in one call, interleaved (A B A B ...), so that lease-
# to-lease variation cannot pass for a speed-up and the current kernel is always in the
# comparison. Run on the GPU machine:
#   SF_PACK_NAME=base scripts/gpu.sh pack main; SF_PACK_NAME=new scripts/gpu.sh pack <branch>
#   (carry .carry/base.tar.xz and .carry/new.tar.xz), then
#   scripts/gpu.sh ab "$(scripts/gpu.sh unpack /tmp/sf-base base)" \
#                     "$(scripts/gpu.sh unpack /tmp/sf-new new)" --only attention
# Prints, per op and shape, each run's milliseconds for A and B and B's median change.
# Env: SF_AB_ROUNDS (default 3). Logs under $OUT (default ./gpu_ab_out).
set -uo pipefail
cd "$(dirname "$0")/../.."
A=$1 B=$2
shift 2
OUT=${OUT:-$PWD/gpu_ab_out}
mkdir -p "$OUT"
for r in $(seq "${SF_AB_ROUNDS:-3}"); do
  for side in A B; do
    dir=$A; [ "$side" = B ] && dir=$B
    timeout "${SF_AB_TIMEOUT:-200}" "$dir/bin/bench_cuda_kernels" --csv "$OUT/$side$r.csv" "$@" \
      > "$OUT/$side$r.log" 2>&1 || echo "$side run $r failed: $(tail -1 "$OUT/$side$r.log")"
  done
done
echo "A = $(cat "$A/COMMIT" 2>/dev/null || echo "$A"), B = $(cat "$B/COMMIT" 2>/dev/null || echo "$B")"
# csv: op,shape,ms,value,unit,frac_of_copy; the shape may hold commas ("seq 1024 x 16, 32/8
# heads, D 128"), so the last four fields are counted from the end.
awk -F, 'FNR == 1 { n_parts = split(FILENAME, parts, "/"); side = substr(parts[n_parts], 1, 1); next }
  { key = $1 " |"; for (f = 2; f <= NF - 4; ++f) key = key $f; ms = $(NF - 3)
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    t[key, side] = t[key, side] " " ms; c[key, side]++; v[key, side, c[key, side]] = ms }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]
      ma = med(k, "A"); mb = med(k, "B")
      printf "%-60s A%s  B%s  B/A %.3f\n", k, t[k, "A"], t[k, "B"], (ma > 0 ? mb / ma : 0)
    }
  }
  function med(k, s,   m, j, x, a, tmp) {
    m = c[k, s]; if (m == 0) return 0
    for (j = 1; j <= m; ++j) a[j] = v[k, s, j] + 0
    for (j = 1; j <= m; ++j) for (x = j + 1; x <= m; ++x) if (a[x] < a[j]) { tmp = a[j]; a[j] = a[x]; a[x] = tmp }
    return a[int((m + 1) / 2)]
  }' "$OUT"/A*.csv "$OUT"/B*.csv
