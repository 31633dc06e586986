#!/usr/bin/env bash
# Fetches NVIDIA's compute-sanitizer (memcheck, racecheck, synccheck) as the PyPI wheel
# nvidia-cuda-sanitizer-api 13.5.25 ships it (pinned by sha256) into .sanitizer/ (git-ignored),
# for a device machine, which reaches no network and has no CUDA toolkit: a device call
# carries the wheel (`carry: [".sanitizer"]`, 18 MB) and `scripts/gpu.sh sanitize` unpacks and
# runs it. It names the faulting kernel, instruction and source line (our CUDA code carries
# -lineinfo), where a test only sees cudaErrorIllegalInstruction or an illegal address.
# Idempotent. Needs python3 -m pip (to download) and sha256sum.
# Usage: scripts/fetch_compute_sanitizer.sh [dir]   (default .sanitizer)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.sanitizer}
WHEEL=nvidia_cuda_sanitizer_api-13.5.25-py3-none-manylinux_2_25_x86_64.whl
WHEEL_SHA256=5df2efbdf605a812c6bac07600dd3d801cb9d334a30376113a6f1e2bc0679f54

. scripts/pinned_wheel.sh
if sha_ok "$DIR/$WHEEL" "$WHEEL_SHA256"; then
  echo "fetch_compute_sanitizer: $DIR/$WHEEL is present"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fetch_pinned_wheel fetch_compute_sanitizer "$TMP" nvidia-cuda-sanitizer-api 13.5.25 \
  manylinux_2_25_x86_64 "$WHEEL" "$WHEEL_SHA256"
mkdir -p "$DIR"
mv "$TMP/$WHEEL" "$DIR/$WHEEL"
echo "fetch_compute_sanitizer: wrote $DIR/$WHEEL"
