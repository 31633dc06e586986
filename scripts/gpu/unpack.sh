#!/usr/bin/env bash
# On the device machine: unpacks .carry/gpu.tar.xz (`scripts/gpu.sh pack`) into a build layout
# (<dir>/bin, <dir>/tests, <dir>/COMMIT) and prints <dir>, for `gpu.sh check` / `gpu.sh engine`:
#   B=$(scripts/gpu.sh unpack) && SF_COMMIT=$(cat $B/COMMIT) scripts/gpu.sh engine $B
# A second pack (SF_PACK_NAME=name scripts/gpu.sh pack): scripts/gpu.sh unpack /tmp/sf-name name
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-/tmp/sf-gpu}
NAME=${2:-gpu}
rm -rf "$B" /tmp/sf-gpu-unpack && mkdir -p "$B/bin" "$B/tests" /tmp/sf-gpu-unpack
tar xJf ".carry/$NAME.tar.xz" -C /tmp/sf-gpu-unpack
P=/tmp/sf-gpu-unpack/$NAME
cp "$P"/slideformer "$P"/bench_cuda_layer "$P"/bench_cuda_kernels "$P"/bench_disk_tier "$B/bin/"
cp "$P"/test_cuda "$P"/test_dist "$B/tests/"
cp "$P"/COMMIT "$B/COMMIT"
echo "$B"
