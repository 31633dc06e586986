#!/usr/bin/env bash
# scripts/gpu.sh attention-bwd BUILD_DIR [64|128]...
# The one-pass attention backward (attention.cuh, launch_attention_backward_atomic) on the GPU,
# in the order that loses least when it fails:
#   1. its test under compute-sanitizer memcheck (scripts/gpu.sh sanitize; a fault names the
#      kernel and the line). A failure stops here: a faulting kernel would end every run after.
#   2. per head dimension, in one call: bench_cuda_kernels' attention rows of each of
#      SF_IMPLS (default: native-atomic = our kernels both ways, native-ws+cudnn-nondet = our
#      forward with cuDNN's backward, cudnn-nondet = the engine's default, native = our
#      deterministic backward) and torch's cuDNN SDPA, all timing regions of calls back to back
#      (--span-ms, default 20), then the table (bench/attention_impls.py).
# Run on the GPU machine with SF_CUDNN_LIB set (torch's cuDNN, as check.sh) and .sanitizer
# carried (scripts/fetch_compute_sanitizer.sh):
#   B=$(scripts/gpu.sh unpack) && scripts/gpu.sh attention-bwd $B 128 64
# Under $OUT (default ./gpu_attention_bwd_out): sanitize.log, attention_bwd.md (what is
# printed), attention_bwd_logs.tgz (ours_<impl>_D<d>.log, torch_D<d>.log).
# Env: SF_IMPLS, SF_SPAN_MS, SF_SANITIZE_TIMEOUT (seconds, default 180: a barrier protocol
#   that deadlocks must not eat the device call), SF_AB_TIMEOUT (seconds per run, default 120),
#   SF_BWD_BUILDS="name=dir ..." (other commits' layouts, scripts/gpu.sh unpack DIR NAME): each
#   one's test under memcheck, then, where it passed, its native-atomic rows beside BUILD's, as
#   column native-atomic@name (sanitize_<name>.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/attention_args.sh
attention_args attention-bwd "$@"
OUT=${OUT:-$PWD/gpu_attention_bwd_out}
mkdir -p "$OUT"
read -r -a impls <<< "${SF_IMPLS:-native-atomic native-ws+cudnn-nondet cudnn-nondet native}"
span=${SF_SPAN_MS:-20}
limit=${SF_AB_TIMEOUT:-120}

memcheck() {  # BUILD OUT_DIR: the one-pass backward's test under memcheck, log in OUT_DIR
  SF_TEST_TIMEOUT=${SF_SANITIZE_TIMEOUT:-180} OUT="$2" \
    bash scripts/gpu/sanitize.sh "$1" 'CudaAttention.AtomicBackward' memcheck
}
memcheck "$BUILD" "$OUT" ||
  { echo "attention-bwd: the one-pass backward's test failed under memcheck: $OUT/sanitize.log"; exit 1; }

read -r -a others <<< "${SF_BWD_BUILDS:-}"
passed=()
for o in "${others[@]}"; do
  name=${o%%=*} dir=${o#*=}
  [ -x "$dir/bin/bench_cuda_kernels" ] || { echo "attention-bwd: $name: no $dir/bin/bench_cuda_kernels"; continue; }
  if memcheck "$dir" "$OUT/san_$name"; then
    passed+=("$o")
  else
    echo "attention-bwd: $name's one-pass backward failed its test under memcheck: its rows are left out"
  fi
  mv "$OUT/san_$name/sanitize.log" "$OUT/sanitize_$name.log" 2>/dev/null
  rm -rf "$OUT/san_$name"
done

export PYTHONUNBUFFERED=1
for d in "${dims[@]}"; do
  for im in "${impls[@]}"; do
    timeout "$limit" "$BUILD/bin/bench_cuda_kernels" --quick --only "attention:D$d" \
      --span-ms "$span" --impl "$im" > "$OUT/ours_${im}_D$d.log" 2>&1 ||
      echo "ours $im D$d failed: $(tail -1 "$OUT/ours_${im}_D$d.log")"
  done
  for o in "${passed[@]}"; do
    name=${o%%=*} dir=${o#*=}
    log="$OUT/ours_native-atomic@${name}_D$d.log"
    timeout "$limit" "$dir/bin/bench_cuda_kernels" --quick --only "attention:D$d" \
      --span-ms "$span" --impl native-atomic > "$log" 2>&1 ||
      echo "ours native-atomic@$name D$d failed: $(tail -1 "$log")"
  done
  timeout "$limit" python3 bench/torch_attention_ref.py --quick --head-dim "$d" \
    --span-ms "$span" --backend cudnn > "$OUT/torch_D$d.log" 2>&1 ||
    echo "torch D$d failed: $(tail -1 "$OUT/torch_D$d.log")"
done
echo "ours: $(cat "$BUILD/COMMIT" 2>/dev/null || echo "$BUILD"), span $span ms"
python3 bench/attention_impls.py "$OUT" | tee "$OUT/attention_bwd.md"
(cd "$OUT" && tar czf attention_bwd_logs.tgz ours_*_D*.log torch_D*.log &&
  rm -f ours_*_D*.log torch_D*.log)
