#!/usr/bin/env bash
# Trains each tiny model of tests/data/configs (every family x every RoPE type, config.json
# as transformers 5 and as transformers 4 spell it) for a few steps with slideformer, then
# checks that transformers loads the saved directory and computes the loss slideformer's
# `eval` reports (fp32 both: host backend, f32 weights; 1e-5 relative).
# usage: scripts/check_hf_configs.sh BUILD_OR_BIN_DIR [OUT_DIR]   (needs python3 with torch
# and transformers; CPU is enough). Prints one line per case and exits 1 if any disagrees.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: check_hf_configs.sh BUILD_DIR [OUT_DIR]}
SF=$B/slideformer; [ -x "$SF" ] || SF=$B/bin/slideformer
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
DATA=tests/data/configs
python3 - "$OUT/tokens.bin" <<'PY'
import sys, numpy as np
np.random.default_rng(11).integers(0, 96, 8192, dtype=np.uint32).tofile(sys.argv[1])
PY
fails=0; n=0
for cfg in "$DATA"/*/config.json; do
  name=$(basename "$(dirname "$cfg")")
  [ "$name" = fields ] && continue
  fam=${name%%_*}
  d="$OUT/$name"; rm -rf "$d"; mkdir -p "$d/model"
  cp "$cfg" "$d/model/config.json"; cp "$DATA/weights/$fam/model.safetensors" "$d/model/"
  if ! "$SF" train --model "$d/model" --tokens "$OUT/tokens.bin" --steps 3 --batch-size 2 \
       --seq-len 47 --lr 1e-3 --backend host --dtype f32 --out "$d/run" --quiet > "$d/train.log" 2>&1; then
    echo "$name: FAIL train ($(tail -1 "$d/train.log"))"; fails=$((fails + 1)); continue
  fi
  saved=$(ls -d "$d"/run/checkpoint-* | sort -V | tail -1)
  loss=$("$SF" eval --model "$saved" --tokens "$OUT/tokens.bin" --batch-size 2 --seq-len 47 \
         --batches 1 --backend host 2>&1 | awk '/^loss/{print $2}')
  r=$(python3 scripts/check_hf_compat.py "$saved" "$OUT/tokens.bin" 47 2 "${loss:-nan}" 1e-5 2>&1)
  rc=$?
  spelling=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('rope_parameters' if 'rope_parameters' in j else 'rope_theta', 'dtype' if 'dtype' in j else 'torch_dtype')" "$saved/config.json")
  echo "$name [$spelling]: $(echo "$r" | tail -1)"
  n=$((n + 1)); [ $rc -eq 0 ] || fails=$((fails + 1))
done
echo "check_hf_configs: $n cases, $fails failed"
[ $fails -eq 0 ]
