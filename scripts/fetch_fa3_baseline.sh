#!/usr/bin/env bash
# Fetches issue 19's FlashAttention-3 baseline for bench/fa3_jax_ref.py: Dao-AILab's sm90a
# kernels as the PyPI wheel dew-flash-attn-cu13 0.3.6 builds them (BSD-3; pinned by sha256),
# of which only libdew_flash_attn3.so (18 MB) is kept, in .fa3/ (git-ignored). A device call
# then carries it (`carry: [".fa3"]`) and runs
#   python3 bench/fa3_jax_ref.py --lib .fa3/libdew_flash_attn3.so   (or SF_FA3_LIB=... for
#   scripts/gpu.sh attention-vs-torch). A benchmark baseline only: slideformer never loads it.
# Idempotent. Needs python3 -m pip (to download), unzip and sha256sum.
# Usage: scripts/fetch_fa3_baseline.sh [dir]   (default .fa3)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.fa3}
WHEEL=dew_flash_attn_cu13-0.3.6-py3-none-manylinux_2_28_x86_64.whl
WHEEL_SHA256=6a2a593f1bb8e302f399eb96f036d88ae41993f03afc13e40855482fad022706
MEMBER=dew_flash_attn/libdew_flash_attn3.so
LIB_SHA256=ed43984d52482fc6aff4229452638f0047c6fc208580cbe8328732cb400dbf9d
LIB=$DIR/$(basename "$MEMBER")

. scripts/pinned_wheel.sh
if sha_ok "$LIB" "$LIB_SHA256"; then
  echo "fetch_fa3_baseline: $LIB is present"
  exit 0
fi
command -v unzip >/dev/null || { echo "fetch_fa3_baseline: unzip is missing" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fetch_pinned_wheel fetch_fa3_baseline "$TMP" dew-flash-attn-cu13 0.3.6 manylinux_2_28_x86_64 \
  "$WHEEL" "$WHEEL_SHA256"
mkdir -p "$DIR"
unzip -q -p "$TMP/$WHEEL" "$MEMBER" > "$LIB.part"
sha_ok "$LIB.part" "$LIB_SHA256" ||
  { rm -f "$LIB.part"; echo "fetch_fa3_baseline: $MEMBER does not have sha256 $LIB_SHA256" >&2; exit 1; }
mv "$LIB.part" "$LIB"
echo "fetch_fa3_baseline: wrote $LIB"
