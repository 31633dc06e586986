#!/usr/bin/env bash
# The engine's and the threaded-streams backend's tests under ThreadSanitizer (CPU only, no
# CUDA): the speculation thread, the update pipeline, the optimizer pools and the lazy stream
# threads of backend/threaded_streams_backend.h race-checked. ~5 min to build on 2 cores.
# Usage: scripts/tsan.sh [build-dir]   (default /tmp/build-tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-/tmp/build-tsan}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSF_WITH_CUDA=OFF \
  -DSF_STATIC_DEPS=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" > "$B.configure.log"
cmake --build "$B" -j "$(nproc)" --target test_engine test_backend
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
"$B/tests/test_engine" --gtest_brief=1
"$B/tests/test_backend" --gtest_brief=1 --gtest_filter='ThreadedStreams*:HostDeterminism*'
echo "tsan: no data race reported"
