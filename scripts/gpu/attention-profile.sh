#!/usr/bin/env bash
# scripts/gpu.sh attention-profile BUILD_DIR D SEQ
# Nsight Compute (ncu, --set full, the clocks left alone) on one attention row (D 64 or 128,
# sequence length SEQ as bench_cuda_kernels --seq): the backward kernels of each of SF_IMPLS
# (default: native-atomic = our one-pass backward, cudnn-nondet = cuDNN's) and, where
# SF_FA3_LIB names libdew_flash_attn3.so (scripts/fetch_fa3_baseline.sh), FlashAttention-3's
# (bench/fa3_jax_ref.py). Where our kernels lose time against the others (tensor-pipe use,
# stall reasons, the L2 traffic of dQ's reduce-adds) is in these reports.
# Under $OUT (default ./gpu_attention_profile_out): <impl>_D<d>_<seq>.ncu-rep (ncu --import
# opens them), <impl>_D<d>_<seq>.txt (the details page), .log (the program's output).
# Env: SF_PROFILE_TIMEOUT (seconds per implementation, default 240).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: scripts/gpu.sh attention-profile BUILD_DIR D SEQ" >&2; exit 2; }
BUILD=$1 D=$2 SEQ=$3
case $D in 64 | 128) ;; *) echo "attention-profile: D '$D': 64 or 128" >&2; exit 2 ;; esac
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -x "$NCU" ] || { echo "attention-profile: no ncu on this machine" >&2; exit 2; }
OUT=${OUT:-$PWD/gpu_attention_profile_out}
mkdir -p "$OUT"
limit=${SF_PROFILE_TIMEOUT:-240}
read -r -a impls <<< "${SF_IMPLS:-native-atomic cudnn-nondet}"

# profile NAME KERNEL_REGEX SKIP COUNT COMMAND...: the COUNT launches matching the regex after
# SKIP of them (warm-up calls are launches like any other: the first timed row's come first).
profile() {
  local name=$1 regex=$2 skip=$3 count=$4
  shift 4
  local base="$OUT/${name}_D${D}_${SEQ}"
  timeout "$limit" "$NCU" --clock-control none --set full --kernel-name-base demangled \
    --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    -f -o "$base" "$@" > "$base.log" 2>&1 ||
    { echo "attention-profile: $name failed: $(tail -2 "$base.log")"; return; }
  "$NCU" --import "$base.ncu-rep" --page details > "$base.txt" 2>&1
  echo "attention-profile: $name -> $(basename "$base").ncu-rep"
}

# Ours: the one-pass kernel (attn_bwd_ws); cuDNN's: its backward kernels (names with "bprop" /
# "dgrad" / "bwd").
regex='attn_bwd|bprop|Bprop|dgrad|bwd|Bwd'
for im in "${impls[@]}"; do
  profile "$im" "$regex" 0 3 "$BUILD/bin/bench_cuda_kernels" --quick --only "attention:D$D" \
    --seq "$SEQ" --impl "$im"
done
if [ -n "${SF_FA3_LIB:-}" ]; then
  # FA3 runs its check (a small backward) first: skip its three kernels (preprocess, main,
  # dQ conversion), then take the row's first backward.
  profile fa3 'bwd|Bwd' 3 3 python3 bench/fa3_jax_ref.py --lib "$SF_FA3_LIB" --quick \
    --head-dim "$D" --seq "$SEQ"
fi
