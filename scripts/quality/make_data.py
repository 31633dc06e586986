#!/usr/bin/env python3
"""Builds the data of the compact-state quality study (issue 18, item 5) from the State of
the Union corpus (233 addresses, 1790-2021; CC0), into one folder (default .quality/raw/,
which .git/info/exclude keeps out of git; make_data.sh xz-packs it into .quality/data/, the
folder that travels with the repo, < 8 MiB).

Split BY YEAR: every address of a year with year % EVAL_MOD == 0 (18 of the 232 years) is
held out; no passage of those years is in any training file, so nothing leaks from the
training text into the evaluation.

Passages: an address is cut at sentence ends into consecutive passages of about
PASSAGE_CHARS characters (~200 SmolLM2 tokens, so most fit a 256-token row whole).

Files written (all JSON Lines, formats of docs/TRAINING.md "Data formats"):
  text_train.jsonl  {"text": passage}                   passages i % 4 == 0 of train years
  chat_train.jsonl  {"messages": [user, assistant]}      passages i % 4 == 2 of train years
  text_eval.jsonl   {"text": ...}                        held-out years, every k-th passage
  chat_eval.jsonl   {"messages": ...}                    held-out years, the same passages
  manifest.json     the years in each split, counts, characters
Chat turns are built from the real text: the user quotes the passage's first sentences and
names the address (president, year) and asks for the continuation; the assistant turn is the
rest of the passage (only it carries loss).

usage: make_data.py [--corpus JSONL] [--out DIR] [--eval-passages N]
Standard library only (no third-party modules)."""
import argparse
import json
import os
import re
import sys

EVAL_MOD = 13          # held-out years: year % 13 == 0 (1794, 1807, ..., 2015)
PASSAGE_CHARS = 900    # target passage length in characters
TRAIN_STRIDE = 4       # text takes passages 0, 4, 8 ...; chat 2, 6, 10 ... (disjoint)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def passages(text):
    """Consecutive passages of whole sentences, each about PASSAGE_CHARS long."""
    out, cur = [], ""
    for s in SENTENCE_END.split(text.strip()):
        cur = f"{cur} {s}" if cur else s
        if len(cur) >= PASSAGE_CHARS:
            out.append(cur)
            cur = ""
    if len(cur) >= PASSAGE_CHARS // 3:  # a short tail alone is too little context
        out.append(cur)
    return out


def chat_record(speech, passage):
    """A user turn quoting the passage's opening and asking for the rest; the assistant turn
    is the rest. None when the passage has a single sentence (nothing to continue)."""
    sentences = SENTENCE_END.split(passage)
    if len(sentences) < 3:
        return None
    k = max(1, len(sentences) // 3)
    opening, rest = " ".join(sentences[:k]), " ".join(sentences[k:])
    user = (f"In his {speech['year']} State of the Union address, {speech['name']} said: "
            f"\"{opening}\" How does that passage continue?")
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": rest}]}


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="/work/shared/data/corpus/sotu.jsonl")
    ap.add_argument("--out", default=".quality/raw")
    ap.add_argument("--eval-passages", type=int, default=160,
                    help="passages in each eval file, spread evenly over the held-out years")
    a = ap.parse_args()
    if not os.path.exists(a.corpus):
        sys.exit(f"make_data: {a.corpus} is missing; pass --corpus (a copy is examples/sotu/sotu.jsonl "
                 "in some checkouts; the shared one is /work/shared/data/corpus/sotu.jsonl)")
    speeches = [json.loads(line) for line in open(a.corpus, encoding="utf-8") if line.strip()]
    for i, s in enumerate(speeches):
        for field in ("year", "name", "text"):
            if field not in s:
                sys.exit(f"make_data: {a.corpus}:{i + 1}: no \"{field}\" field")
    train = [s for s in speeches if s["year"] % EVAL_MOD != 0]
    held = [s for s in speeches if s["year"] % EVAL_MOD == 0]
    if not held or not train:
        sys.exit(f"make_data: {a.corpus}: the year split left a side empty")

    text_train, chat_train = [], []
    for s in train:
        for i, p in enumerate(passages(s["text"])):
            if i % TRAIN_STRIDE == 0:
                text_train.append({"text": p})
            elif i % TRAIN_STRIDE == 2 and (r := chat_record(s, p)):
                chat_train.append(r)
    held_pairs = [(s, p) for s in held for p in passages(s["text"])]
    held_pairs = [(s, p) for s, p in held_pairs if chat_record(s, p)]
    step = max(1, len(held_pairs) // a.eval_passages)
    picked = held_pairs[::step][: a.eval_passages]

    os.makedirs(a.out, exist_ok=True)
    sizes = {
        "text_train.jsonl": write_jsonl(f"{a.out}/text_train.jsonl", text_train),
        "chat_train.jsonl": write_jsonl(f"{a.out}/chat_train.jsonl", chat_train),
        "text_eval.jsonl": write_jsonl(f"{a.out}/text_eval.jsonl", [{"text": p} for _, p in picked]),
        "chat_eval.jsonl": write_jsonl(f"{a.out}/chat_eval.jsonl", [chat_record(s, p) for s, p in picked]),
    }
    manifest = {
        "corpus": os.path.abspath(a.corpus),
        "split": f"held out: every address of a year with year % {EVAL_MOD} == 0",
        "eval_years": sorted({s["year"] for s in held}),
        "train_addresses": len(train), "eval_addresses": len(held),
        "records": {"text_train": len(text_train), "chat_train": len(chat_train),
                    "text_eval": len(picked), "chat_eval": len(picked)},
        "bytes": sizes,
    }
    with open(f"{a.out}/manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
    for name, n in sizes.items():
        print(f"{a.out}/{name}: {n / 1e6:.2f} MB")
    print(f"held-out years ({len(held)} addresses): {manifest['eval_years']}")


if __name__ == "__main__":
    main()
