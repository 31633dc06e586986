#!/usr/bin/env bash
# Fails where ptxas serializes the wgmma of a Hopper kernel. ptxas reports that only as an info
# line (C7510-C7519: "wgmma.mma_async instructions are serialized due to ..."), the build
# succeeds, and the kernel then waits for each product before issuing the next: correct, and
# several times slower. Compiles each source with wgmma kernels for sm_90a as the build does
# (Release flags) with -Xptxas -v, and prints every such line and every spill.
# Usage: scripts/check_wgmma.sh NVCC [SOURCE_DIR]      (run by CTest where CUDA is built)
set -uo pipefail
NVCC=${1:?usage: scripts/check_wgmma.sh NVCC [SOURCE_DIR]}
SRC=${2:-$(cd "$(dirname "$0")/.." && pwd)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
status=0
for f in "$SRC"/src/backend/cuda/attention_sm90*.cu; do
  log=$TMP/$(basename "$f").log
  if ! "$NVCC" -DSF_BUILD_SM90A=1 -DSF_WITH_CUDA=1 -DSF_WITH_CUDNN=1 -I"$SRC/src" -std=c++20 \
      -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -Xptxas -v -c "$f" -o "$TMP/out.o" > "$log" 2>&1; then
    echo "FAIL $(basename "$f"): does not compile"; tail -5 "$log"; status=1; continue
  fi
  if grep -q "C751[0-9]" "$log"; then
    echo "FAIL $(basename "$f"): ptxas serializes wgmma:"
    grep "C751[0-9]" "$log" | sed 's/^ptxas info *: //'
    status=1
  else
    echo "ok   $(basename "$f"): no serialized wgmma"
  fi
  grep -B2 "[1-9][0-9]* bytes spill stores" "$log" | grep -E "Compiling entry|spill" |
    sed 's/^ptxas info *: //; s/^ */     /'
done
exit $status
