#!/usr/bin/env bash
# Builds the GPU binaries of a commit here (no GPU needed) and packs them for the device
# machine: .carry/gpu.tar.xz (pass it to the device tool's `carry`), then on that machine
# `scripts/gpu.sh unpack` puts them where `gpu.sh check` / `gpu.sh engine` look.
#
# Usage: scripts/gpu.sh pack [commit]     (default HEAD)
#   SF_PACK_NAME=name packs into .carry/<name>.tar.xz instead of gpu.tar.xz, so that two
#   commits can travel together for an A/B in one call (`gpu.sh ab`, `try`, `engine-ab`).
#   The build runs in a git worktree of the commit (../wt-gpu, build dir kept between runs),
#   so uncommitted edits in this checkout (yours or a helper's) never leak into the binaries.
#   SF_CUDA_ARCHS (default 90a) picks the architectures; Release, stripped.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
COMMIT=$(git rev-parse --short "${1:-HEAD}")
WT=${SF_GPU_WORKTREE:-$ROOT/../wt-gpu}
if [ ! -d "$WT/.git" ] && [ ! -f "$WT/.git" ]; then
  git worktree add -q --detach "$WT" "$COMMIT"
else
  git -C "$WT" checkout -q --detach "$COMMIT"
fi
cmake -S "$WT" -B "$WT/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSF_CUDA_ARCHS="${SF_CUDA_ARCHS:-90a}" > /dev/null
cmake --build "$WT/build-gpu" --target slideformer test_cuda test_dist bench_cuda_layer bench_cuda_kernels bench_disk_tier \
  -j"$(nproc)"
NAME=${SF_PACK_NAME:-gpu}
rm -rf ".carry/$NAME" && mkdir -p ".carry/$NAME"
cp "$WT"/build-gpu/bin/{slideformer,bench_cuda_layer,bench_cuda_kernels,bench_disk_tier} "$WT"/build-gpu/tests/{test_cuda,test_dist} ".carry/$NAME/"
strip ".carry/$NAME"/*
echo "$COMMIT" > ".carry/$NAME/COMMIT"
tar cJf ".carry/$NAME.tar.xz" -C .carry "$NAME"
echo "packed $COMMIT: $(du -h ".carry/$NAME.tar.xz" | cut -f1) in .carry/$NAME.tar.xz (carry it)"
