#!/usr/bin/env bash
# `slideformer train` on a GPU machine: the bundled example on CUDA (resident and sliding
# window), Ctrl-C + resume compared with an uninterrupted run (losses and fp32 state, bitwise
# or the largest difference), and a larger preset for throughput and memory on the status line.
# Usage: scripts/gpu.sh train-check [slideformer binary]   Logs and plots under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
SF=${1:-build-gpu/bin/slideformer}
OUT=${OUT:-$PWD/gpu_train_out}
W=${W:-/tmp/sf-gpu-train}
rm -rf "$W"; mkdir -p "$OUT" "$W"
S="$OUT/train_summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)  $(nproc) cores"

run() {  # name, env, args...
  local name=$1 env=$2; shift 2
  local t0=$(date +%s%N)
  env $env "$SF" train --progress lines --backend cuda "$@" > "$W/$name.log" 2>&1
  local rc=$?
  say "$name: rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(grep -E '^eval  step' "$W/$name.log" | tail -1)"
}

compare() {  # dir a, dir b (output directories, same final step)
  python3 - "$1" "$2" <<'EOF' | tee -a "$S"
import json, sys, os
import torch
from safetensors.torch import load_file
a, b = sys.argv[1], sys.argv[2]
def latest(d): return os.path.join(d, open(os.path.join(d, "latest")).read().strip())
ca, cb = latest(a), latest(b)
for f in ["resume/master.safetensors", "resume/adam_m.safetensors", "resume/adam_v.safetensors", "model.safetensors"]:
    A, B = load_file(os.path.join(ca, f)), load_file(os.path.join(cb, f))
    same = all(torch.equal(A[k], B[k]) for k in A)
    d = max(float((A[k].double() - B[k].double()).abs().max()) for k in A)
    print(f"  {os.path.basename(a)} vs {os.path.basename(b)} {f}: {'bitwise equal' if same else 'DIFFER'} (max |diff| {d:.3g})")
def losses(d): return [json.loads(l).get("loss") for l in open(os.path.join(d, "metrics.jsonl")) if "loss" in json.loads(l)]
la, lb = losses(a), losses(b)
print(f"  losses: {len(la)} vs {len(lb)} steps, {'identical' if la == lb else 'max |diff| %.3g' % max(abs(x - y) for x, y in zip(la, lb))}")
EOF
}

# 1. The example data on the "small" preset (the tiny one's head_dim 32 has no CUDA attention),
#    resident on the GPU; then Ctrl-C at step 10 and resume. --deterministic: the default
#    attention backward (cuDNN's, accumulating with atomics) differs in the last bits from run
#    to run, so only the deterministic one can show a resume bit for bit; SF_GEMM_TUNE=0 (E):
#    tuned GEMMs time their candidates afresh in each process and may pick another tile shape.
E="SF_GEMM_TUNE=0"
M="--example-size small --batch-size 8 --seq-len 128 --steps 30 --eval-every 10 --deterministic"
run resident "$E" $M --out "$W/a" --save-every 10
run resident-int "$E SF_TEST_FAULT=sigint@step:10" $M --out "$W/b" --save-every 10
run resident-resume "$E" $M --out "$W/b" --resume
compare "$W/a" "$W/b"
cp "$W/a/loss.png" "$OUT/resident_loss.png"

# 2. The same through the sliding window (forced), interrupted and resumed.
run sliding "$E" $M --engine sliding --out "$W/c" --save-every 10
run sliding-int "$E SF_TEST_FAULT=sigint@step:10" $M --engine sliding --out "$W/d" --save-every 10
run sliding-resume "$E" $M --engine sliding --out "$W/d" --resume
compare "$W/c" "$W/d"
compare "$W/a" "$W/c"

# 3. A larger preset: throughput and memory on the status line.
run small "" --example-size small --out "$W/e" --steps 30 --batch-size 16 --seq-len 512 --eval-every 0 --log-every 5
grep -E '^step' "$W/small.log" | tail -3 | tee -a "$S"

for f in resident resident-resume sliding sliding-resume small; do cp "$W/$f.log" "$OUT/$f.log"; done
