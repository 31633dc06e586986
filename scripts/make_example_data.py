#!/usr/bin/env python3
"""Builds the bundled example data (examples/sotu/) from the public-domain State of the Union
corpus: a JSONL subset ({"text": ...} per line) and its GPT-2 token ids as an llm.c v2 .bin.
Run once by a developer (needs the `tokenizers` package); the outputs are committed so that
slideformer itself never needs Python."""
import json, struct, sys, pathlib

from tokenizers import Tokenizer

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/corpus/sotu.jsonl")
tok_dir = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "../shared/data/tokenizers/gpt2")
out = pathlib.Path(__file__).resolve().parent.parent / "examples" / "sotu"
out.mkdir(parents=True, exist_ok=True)

rows = [json.loads(l) for l in src.read_text().splitlines() if l.strip()]
rows.sort(key=lambda r: int(r["year"]))
subset = rows[-24:]  # the most recent addresses: ~1 MB of text
with open(out / "sotu.jsonl", "w") as f:
    for r in subset:
        f.write(json.dumps({"text": r["text"], "year": r["year"], "name": r["name"]}) + "\n")

tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
eot = tok.token_to_id("<|endoftext|>")
ids = []
for r in subset:
    ids.extend(tok.encode(r["text"]).ids)
    ids.append(eot)
header = [20240520, 2, len(ids)] + [0] * 253
with open(out / "sotu-gpt2.bin", "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(ids)}I", *ids))
print(len(subset), "documents,", len(ids), "tokens")
