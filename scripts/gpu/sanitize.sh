#!/usr/bin/env bash
# Runs GPU tests under compute-sanitizer, on the GPU machine, to name a kernel fault's kernel,
# instruction and source line (a test only sees cudaErrorIllegalInstruction, and the fault ends
# its process's CUDA context). The sanitizer comes as a wheel carried in .sanitizer/
# (scripts/fetch_compute_sanitizer.sh, here); this unpacks it with python3's zipfile.
# Usage: scripts/gpu.sh sanitize BUILD [gtest-filter] [tool]
#   BUILD: a build layout (scripts/gpu.sh unpack); filter default 'CudaAttention*';
#   tool: memcheck (default), racecheck, synccheck, initcheck. Extra env (e.g. SF_CUDNN_LIB)
#   passes through to the tests. Log: $OUT/sanitize.log; its last lines are printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: scripts/gpu.sh sanitize BUILD [gtest-filter] [tool]}
FILTER=${2:-CudaAttention*}
TOOL=${3:-memcheck}
OUT=${OUT:-$PWD/gpu_sanitize_out}
mkdir -p "$OUT"
WHEEL=$(ls .sanitizer/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -1)
if [ -z "$WHEEL" ]; then
  echo "sanitize: no wheel in .sanitizer/ (run scripts/fetch_compute_sanitizer.sh here and carry .sanitizer)" >&2
  exit 2
fi
DIR=/tmp/sf-sanitizer
if [ ! -x "$DIR/nvidia/cu13/compute-sanitizer/compute-sanitizer" ]; then
  rm -rf "$DIR" && mkdir -p "$DIR"
  python3 -m zipfile -e "$WHEEL" "$DIR" || { echo "sanitize: could not unpack $WHEEL" >&2; exit 2; }
  chmod +x "$DIR"/nvidia/cu13/compute-sanitizer/compute-sanitizer \
    "$DIR"/nvidia/cu13/compute-sanitizer/TreeLauncher* "$DIR"/nvidia/cu13/compute-sanitizer/x86/TreeLauncher* 2>/dev/null
fi
SAN=$DIR/nvidia/cu13/compute-sanitizer/compute-sanitizer
timeout "${SF_TEST_TIMEOUT:-500}" "$SAN" --tool "$TOOL" --show-backtrace device --print-limit 20 \
  "$BUILD/tests/test_cuda" --gtest_color=no --gtest_filter="$FILTER" > "$OUT/sanitize.log" 2>&1
rc=$?
echo "sanitize ($TOOL, $FILTER): rc $rc"
grep -E "^=========|^\[  FAILED|^\[  PASSED" "$OUT/sanitize.log" | head -60
exit $rc
