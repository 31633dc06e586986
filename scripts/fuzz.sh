#!/usr/bin/env bash
# Fuzzes the safetensors header parser: builds fuzz/fuzz_safetensors with clang-14
# (libFuzzer + ASan + UBSan) in its own build dir, seeds a corpus with valid files the
# project's writer produces, and runs for a bounded time.
# Usage: scripts/fuzz.sh [seconds=60]      env: SF_FUZZ_BUILD (build-fuzz), SF_FUZZ_JOBS (1)
# Exit status: non-zero when the fuzzer finds a crash; the reproducer is left in
# $SF_FUZZ_BUILD/crashes/ (replay: $SF_FUZZ_BUILD/fuzz/fuzz_safetensors <file>).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
BUILD=${SF_FUZZ_BUILD:-build-fuzz}
JOBS=${SF_FUZZ_JOBS:-1}

CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSF_BUILD_FUZZERS=ON -DSF_WITH_CUDA=OFF -DSF_BUILD_TESTS=OFF -DSF_STATIC_DEPS=OFF >/dev/null
cmake --build "$BUILD" --target fuzz_safetensors -j2

FUZZ=$BUILD/fuzz/fuzz_safetensors
CORPUS=$BUILD/fuzz-corpus   # grows across runs
SEEDS=$BUILD/fuzz-seeds
CRASHES=$BUILD/crashes
mkdir -p "$CORPUS" "$CRASHES"
rm -rf "$SEEDS"
SF_FUZZ_WRITE_SEEDS=$SEEDS "$FUZZ"

# The header's vocabulary, so mutations reach the validator's deeper checks.
DICT=$(cd "$BUILD" && pwd)/safetensors.dict
cat >"$DICT" <<'DICT_END'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"BF16\""
"\"F16\""
"\"F32\""
"\"I64\""
"\"U8\""
"\"F8_E4M3\""
"18446744073709551615"
"9223372036854775807"
"-1"
"4294967296"
"[0,0]"
"[]"
"{}"
DICT_END

echo "fuzz.sh: running $FUZZ for ${SECS}s ($JOBS job(s))"
PAR=()
# -jobs makes libFuzzer fork workers that log to ./fuzz-N.log: run them in the build dir.
[ "$JOBS" -gt 1 ] && PAR=(-jobs="$JOBS" -workers="$JOBS")
ABS=$(cd "$BUILD" && pwd)
before=$(ls "$CRASHES" | wc -l)
set +e
(cd "$ABS" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$ABS/fuzz/fuzz_safetensors" "$ABS/fuzz-corpus" "$ABS/fuzz-seeds" -dict="$DICT" \
  -max_total_time="$SECS" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$ABS/crashes/" -print_final_stats=1 "${PAR[@]}")
rc=$?
set -e
after=$(ls "$CRASHES" | wc -l)
if [ $rc -eq 0 ] && [ "$after" -gt "$before" ]; then rc=1; fi  # a worker's crash (-jobs)
if [ $rc -ne 0 ]; then
  echo "fuzz.sh: FAILED (exit $rc); reproducers in $CRASHES/:" >&2
  ls -l "$CRASHES" >&2
  exit $rc
fi
echo "fuzz.sh: no crash in ${SECS}s"
