#!/usr/bin/env bash
# Checks the study's tooling without a GPU: report.py on the host dry run's csv
# (testdata/dry-run-host.csv, made by scripts/gpu.sh quality with SF_Q_BACKEND=host and 3 / 4
# steps) gives one row per run and a PNG; a mode 1% above fp32 fails the 0.5% target and one
# 0.4% above meets it; a csv without the fp32 run or with a column missing is refused by name;
# quality.sh refuses missing arguments, a missing binary and a data folder without the data.
# Usage: PYTHON=python-with-matplotlib scripts/quality/test_report.sh   (exit 0: all passed)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CSV=scripts/quality/testdata/dry-run-host.csv
fails=0
check() {  # description, then a command that must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }
report() { "$PY" scripts/quality/report.py "$@" > "$T/out" 2> "$T/err"; }

check "report.py on the dry run" report "$CSV" --png "$T/q.png"
check "... one row per run (2 models x 5 modes)" [ "$(grep -c '^| smollm2-135m \|^| tiny ' "$T/out")" = 10 ]
check "... writes the PNG" [ -s "$T/q.png" ]
check "... int8/fp32 meets its target there" grep -q '^| smollm2-135m | int8/fp32 | .* | 0.5% | yes |' "$T/out"

# set_final FACTOR: the int8/fp32 SmolLM2 run's final-all loss = FACTOR x fp32's.
set_final() {
  awk -F, -v OFS=, -v f="$1" '$1 == "fp32/fp32" && $4 == "final-all" { ref = $7 }
    $1 == "int8/fp32" && $4 == "final-all" { $7 = ref * f } { print }' "$CSV" > "$T/m.csv"
}
set_final 1.01
check "1% above fp32: the 0.5% target is not met" report "$T/m.csv" --png ""
check "... marked no, +1.00%" grep -q '^| smollm2-135m | int8/fp32 | .* | +1.00% | 0.5% | \*\*no\*\* |' "$T/out"
set_final 1.004
check "0.4% above fp32: met" report "$T/m.csv" --png ""
check "... marked yes, +0.40%" grep -q '^| smollm2-135m | int8/fp32 | .* | +0.40% | 0.5% | yes |' "$T/out"

grep -v '^fp32/fp32,tiny' "$CSV" > "$T/noref.csv"
check "no fp32 run of a model: refused" bash -c "! $PY scripts/quality/report.py $T/noref.csv --png '' > /dev/null 2> $T/err"
check "... naming the model" has "$T/err" "model tiny: no fp32/fp32 run to compare with"
sed '1s/,tokens_per_s//' "$CSV" > "$T/nocol.csv"
check "a column missing: refused" bash -c "! $PY scripts/quality/report.py $T/nocol.csv --png '' > /dev/null 2> $T/err"
check "... naming it" has "$T/err" "no column tokens_per_s"

check "quality.sh without arguments fails" bash -c "! OUT=$T/qout bash scripts/gpu.sh quality > $T/qo 2>&1"
check "... with its usage" has "$T/qo" "usage: scripts/gpu.sh quality BUILD_DIR GGUF DATA_DIR"
check "quality.sh with no binary fails" bash -c "! OUT=$T/qout bash scripts/gpu.sh quality $T/nobuild x y > $T/qo 2>&1"
check "... naming it" has "$T/qo" "$T/nobuild/bin/slideformer is missing"
mkdir -p "$T/b/bin" "$T/d"; printf '#!/bin/sh\nexit 0\n' > "$T/b/bin/slideformer"; chmod +x "$T/b/bin/slideformer"
touch "$T/g.gguf"
check "quality.sh with an empty data folder fails" bash -c "! OUT=$T/qout bash scripts/gpu.sh quality $T/b $T/g.gguf $T/d > $T/qo 2>&1"
check "... pointing to make_data.sh" has "$T/qo" "$T/d/text_train.jsonl.xz is missing: run scripts/quality/make_data.sh"

[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
[ "$fails" = 0 ]
