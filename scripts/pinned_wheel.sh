# Sourced by the scripts that fetch a pinned PyPI wheel (fetch_compute_sanitizer.sh,
# fetch_fa3_baseline.sh): the download and its sha256 check, each failure a message naming the
# script (WHO) and what went wrong.

# sha_ok FILE SHA256: FILE exists and has that sha256.
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# fetch_pinned_wheel WHO DIR PKG VERSION PLATFORM WHEEL SHA256: downloads PKG==VERSION's wheel
# for PLATFORM (CPython 3.12) into DIR and checks that DIR/WHEEL has SHA256; exits 1 otherwise.
fetch_pinned_wheel() {
  local who=$1 dir=$2 pkg=$3 version=$4 platform=$5 wheel=$6 sha=$7
  command -v sha256sum >/dev/null || { echo "$who: sha256sum is missing" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform "$platform" -d "$dir" "$pkg==$version" ||
    { echo "$who: pip could not download $pkg $version" >&2; exit 1; }
  sha_ok "$dir/$wheel" "$sha" || { echo "$who: $wheel does not have sha256 $sha" >&2; exit 1; }
}
