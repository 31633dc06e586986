#!/usr/bin/env bash
# scripts/gpu.sh engine-ab A_DIR B_DIR
# The engine benchmark's A/B in one call: `slideformer bench` of two unpacked builds
# (A_DIR/bin/slideformer, from `scripts/gpu.sh unpack DIR NAME`) on the shapes of SF_BENCH,
# interleaved (round 1: shape 1 A B, shape 2 A B, ...; then round 2, ...), so that drift
# between runs cannot pass for a change. Run on the GPU machine:
#   scripts/gpu.sh engine-ab "$(scripts/gpu.sh unpack /tmp/sf-base base)" \
#                            "$(scripts/gpu.sh unpack /tmp/sf-new new)"
# Prints per shape each run's tokens/s (all timed steps) and steady tokens/s (the steps after
# an unclipped one), peak GPU and peak host RSS (GiB), for A and B, and B's change of the
# median of each (the median of an even count: the mean of the middle two).
# Env: SF_BENCH (one shape per line, as `gpu.sh engine`: "<size> <layers|0> <batch> <seq>
#   <gpu-memory> [further bench flags]"; default the 8B and its 8-layer cut at batch 32 x 1024,
#   24 GiB), SF_AB_ROUNDS (default 2), SF_BENCH_STEPS (default 12), SF_BENCH_TIMEOUT (seconds
#   per run, default 420), SF_TRACE_STEPS=1 (the engine's host timeline in each log),
#   SF_AB_ENV_A / SF_AB_ENV_B (NAME=VALUE words set for that side's runs only: one build with
#   and without a switch, e.g. `SF_AB_ENV_B=SF_ATTN=split scripts/gpu.sh engine-ab $B $B`).
# Logs under $OUT (default ./gpu_engine_ab_out): <shape>_A1.log, <shape>_B1.log, ... (the
# shape named as `gpu.sh engine` names its logs), runs.tsv (one line per run) and
# engine_ab_summary.txt (what is printed).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/bench_shape.sh
die() { echo "engine-ab: $*" >&2; exit 2; }
[ $# -eq 2 ] || die "usage: scripts/gpu.sh engine-ab A_DIR B_DIR (unpacked builds; got $# arguments)"
A=$1 B=$2
for d in "$A" "$B"; do
  [ -x "$d/bin/slideformer" ] ||
    die "$d/bin/slideformer is not an executable (lay a pack out with scripts/gpu.sh unpack DIR NAME)"
done
read -r -a env_a <<< "${SF_AB_ENV_A:-}"
read -r -a env_b <<< "${SF_AB_ENV_B:-}"
for kv in "${env_a[@]}" "${env_b[@]}"; do
  [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || die "SF_AB_ENV_A / SF_AB_ENV_B word '$kv' is not NAME=VALUE"
done
ROUNDS=${SF_AB_ROUNDS:-2}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "SF_AB_ROUNDS=$ROUNDS is not a positive count"
SF_BENCH=${SF_BENCH:-"llama3-8b 8 32 1024 24GiB
llama3-8b 0 32 1024 24GiB"}
n_shapes=0
while read -r size layers batch seq mem extra; do
  [ -z "$size" ] && continue
  [[ $layers =~ ^[0-9]+$ && $batch =~ ^[0-9]+$ && $seq =~ ^[0-9]+$ && -n $mem ]] ||
    die "SF_BENCH line '$size $layers $batch $seq $mem $extra' is not '<size> <layers|0> <batch> <seq> <gpu-memory> [flags]'"
  n_shapes=$((n_shapes + 1))
done <<< "$SF_BENCH"
[ "$n_shapes" -gt 0 ] || die "SF_BENCH holds no shape"

OUT=${OUT:-$PWD/gpu_engine_ab_out}
mkdir -p "$OUT"
S="$OUT/engine_ab_summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
TSV="$OUT/runs.tsv"
printf 'shape\tside\tround\trc\ttokens/s\tsteady_tokens/s\tpeak_gpu_GiB\tpeak_rss_GiB\n' > "$TSV"
say "A = $(cat "$A/COMMIT" 2>/dev/null || echo "$A")${env_a[*]:+ (${env_a[*]})}, B = $(cat "$B/COMMIT" 2>/dev/null || echo "$B")${env_b[*]:+ (${env_b[*]})}, $ROUNDS rounds"

# result_fields LOG: the RESULT line's tokens/s, steady_tokens/s, peak_gpu_GiB, peak_rss_GiB,
# tab-separated ("-" for each when the run printed no RESULT line).
result_fields() {
  awk '/^RESULT / { line = $0 }
    END {
      n = split(line, f, " ")
      for (i = 2; i <= n; ++i) { eq = index(f[i], "="); if (eq > 0) v[substr(f[i], 1, eq - 1)] = substr(f[i], eq + 1) }
      split("tokens/s steady_tokens/s peak_gpu_GiB peak_rss_GiB", keys, " ")
      for (k = 1; k <= 4; ++k) printf "%s%s", (k > 1 ? "\t" : ""), ((keys[k] in v) ? v[keys[k]] : "-")
      print ""
    }' "$1"
}

for r in $(seq "$ROUNDS"); do
  while read -r size layers batch seq mem extra; do
    [ -z "$size" ] && continue
    name=$(bench_shape_name "$size" "$layers" "$batch" "$seq" "$mem" "$extra")
    label="$size layers=$layers ${batch}x$seq $mem${extra:+ $extra}"
    for side in A B; do
      dir=$A vars=("${env_a[@]}")
      [ "$side" = B ] && dir=$B vars=("${env_b[@]}")
      log="$OUT/${name}_$side$r.log"
      (for kv in "${vars[@]}"; do export "$kv"; done
       bench_shape "$dir/bin/slideformer" "$log" "$size" "$layers" "$batch" "$seq" "$mem" "$extra")
      rc=$?
      [ "$rc" -ne 0 ] && say "$side run $r of $label failed (rc $rc): $(tail -1 "$log")"
      printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$side" "$r" "$rc" "$(result_fields "$log")" >> "$TSV"
    done
  done <<< "$SF_BENCH"
done

# Per shape (first-seen order) and metric: A's runs, B's runs, B's change of the median.
awk -F'\t' 'NR == 1 { for (c = 5; c <= 8; ++c) metric[c] = $c; next }
  { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
    for (c = 5; c <= 8; ++c) {
      runs[$1, $2, c] = runs[$1, $2, c] " " $c
      if ($c != "-") vals[$1, $2, c, ++cnt[$1, $2, c]] = $c + 0
    } }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]
      print k
      for (c = 5; c <= 8; ++c) {
        ma = med(k, "A", c); mb = med(k, "B", c)
        change = (ma > 0 && mb > 0) ? sprintf("%+.2f%%", 100 * (mb / ma - 1)) : "n/a"
        printf "  %-16s A%s  B%s  B vs A %s\n", metric[c], runs[k, "A", c], runs[k, "B", c], change
      }
    }
  }
  function med(k, s, c,   m, j, x, a, tmp) {
    m = cnt[k, s, c]; if (m == 0) return 0
    for (j = 1; j <= m; ++j) a[j] = vals[k, s, c, j]
    for (j = 1; j <= m; ++j) for (x = j + 1; x <= m; ++x) if (a[x] < a[j]) { tmp = a[j]; a[j] = a[x]; a[x] = tmp }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }' "$TSV" | tee -a "$S"
