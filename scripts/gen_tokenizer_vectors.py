#!/usr/bin/env python3
"""Generates tests/data/tokenizers/vectors.json: the token ids and decoded text that the
Hugging Face `tokenizers` library produces, which tests/text/test_tokenizer*.cpp compare the
native tokenizer (src/text/tokenizer.h) against, with no Python or network at test time.

Each entry names a base tokenizer.json (committed under tests/data/tokenizers/, or under
../shared/data/ beside the repository for files too big to commit) and an optional patch:
keys of the tokenizer.json replaced by new values ("a.b" names key b inside object a). Patches build variants that
exercise other pipeline paths (the Llama-3 and Qwen split regexes, NFC, Digits, Metaspace,
added-token flags) over the same vocabularies; the C++ test applies the same replacement.

For every case text it records ids = encode(text, add_special_tokens=False).ids, the ids with
encode_special_tokens=True (special tokens in the text treated as text), and decode() of the
ids with and without skip_special_tokens. Cases with invalid UTF-8 carry raw_hex; the
expected values are for the text after bytes.decode("utf-8", "replace"). It also records
decode() of seeded random id sequences, and vocab_size / token_to_id / id_to_token samples.

Usage (needs PyPI tokenizers==0.23.3):
  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install tokenizers==0.23.3
  /tmp/tv/bin/python scripts/gen_tokenizer_vectors.py            # writes the vectors file
  /tmp/tv/bin/python scripts/gen_tokenizer_vectors.py --full OUT # + whole-corpus ids (dev check)
"""
import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")
SHARED = os.path.join(ROOT, "..", "shared", "data")
EXPECTED_VERSION = "0.23.3"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level(prefix, regex, trim=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": trim, "use_regex": regex}


def added(id_, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


GPT2_EOT = added(50256, "<|endoftext|>")

VARIANTS = [
    ("gpt2", "gpt2/tokenizer.json", None),
    ("gpt2_prefix_space", "gpt2/tokenizer.json", {
        "pre_tokenizer": byte_level(True, True), "decoder": byte_level(True, True)}),
    # Llama-3's pre-tokenizer over the GPT-2 vocabulary, with Llama-3-style special tokens and,
    # as Llama-3's file has, ignore_merges (a word in the vocabulary is one token).
    ("llama3_regex", "gpt2/tokenizer.json", {
        "model.ignore_merges": True,
        "added_tokens": [GPT2_EOT, added(50257, "<|begin_of_text|>"), added(50258, "<|eot_id|>"),
                         added(50259, "<|start_header_id|>"), added(50260, "<|end_header_id|>")],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level(False, False)]},
        "decoder": byte_level(True, False)}),
    # Qwen2/3's normalizer and pre-tokenizer over the GPT-2 vocabulary (runs without shared/).
    ("qwen_regex_nfc", "gpt2/tokenizer.json", {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level(False, False)]}}),
    # Added-token flags: lstrip / rstrip / single_word / normalized, non-special tokens.
    ("added_flags", "gpt2/tokenizer.json", {
        "normalizer": {"type": "NFC"},
        "added_tokens": [GPT2_EOT,
                         added(50257, "<mask>", lstrip=True),
                         added(50258, "[R]", special=False, rstrip=True),
                         added(50259, "both", special=False, lstrip=True, rstrip=True, single_word=True),
                         added(50260, "caf\u00e9", special=False, normalized=True),
                         added(50261, "word", special=True, single_word=True),
                         added(50262, "<tool>", special=False)]}),
    # SmolLM2-style: Digits then ByteLevel with the GPT-2 regex.
    ("gpt2_digits", "gpt2/tokenizer.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level(False, True)]}}),
    ("qwen3", "shared:tokenizers/qwen3/tokenizer.json", None),
    # Mistral v0.1 as transformers writes it (legacy): Prepend + Replace normalizer.
    ("mistral", "mistral/tokenizer.json", None),
    # The same vocabulary as transformers writes it with legacy=False: Metaspace(first).
    ("mistral_metaspace_first", "mistral/tokenizer.json", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}}),
    # Metaspace(always, split) and the Metaspace decoder; a Split with a string pattern.
    ("mistral_metaspace_split", "mistral/tokenizer.json", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
            {"type": "Fuse"}]}}),
]

CASES = [
    "", "Hello world", "Hello, world!", " leading space", "trailing space  ", "  multiple   spaces  between ",
    " ", "  ", "a", "\ttabs\tand\t\ttabs", "line1\nline2\n\nline4\r\nwindows\r\n", "\n\n\n", "   \n  \n ",
    "\r", "\r\n", "x \n y", "end with newline\n", "a\u00a0b", "\u3000ideographic\u3000space", "a\u2028b\u2029c",
    "\u0085next line", "\x0b\x0c vertical tab and form feed", "\x1c\x1d\x1e\x1f info separators",
    "1", "12", "123", "1234", "12345", "12345678901234567890", "3.14159", "1,000,000", "x1y22z333w4444",
    " 42 and 7", "\u0663\u0664\u0665 arabic-indic", "\u216b roman twelve", "\u00bd and \u00b2", "\uff11\uff12\uff13",
    "don't", "DON'T", "we'll", "We'LL", "I'm", "you're", "they've", "she'd", "it's", "IT'S", "'s", "''",
    "rock'n'roll", "'\u017f long s", "O'Neil's dog's", "'Tis", "abc'", " 'quoted' ", "he said 'hello'",
    "caf\u00e9", "cafe\u0301", "cafe\u0301s", "na\u00efve r\u00e9sum\u00e9", "\u00c5ngstr\u00f6m A\u030angstro\u0308m",
    "Z\u00fcrich stra\u00dfe", "\ufb01 ligature", "\u03a9 \u2248 \u00e7 \u221a \u222b",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u1100\u1161\u11a8 jamo", "e\u0301\u0323 reorder", "q\u0323\u0307",
    "\u0065\u0304\u0301", "\u212b angstrom sign", "\u2126 ohm", "\u1e9b\u0323",
    "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5", "I \u2764\ufe0f NY",
    "emoji\U0001f600in\U0001f600text", " \U0001f600 ", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002", "\u4e2d\u6587\u548cEnglish\u6df7\u5408123",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\x00\x01\x1f\x7f controls", "\u200b zero width", "\ufeffBOM", "\U0010ffff", "\u0378 unassigned",
    "\ue000 private use", "\u1c89 Unicode 16 letter", "\U0001ccf0 Unicode 16 digit", "\u0897 Unicode 14 mark",
    "a" * 300, "supercalifragilisticexpialidocious", "ab" * 40, " " * 50, "\n" * 20, "!" * 30,
    "Hello,   world!  \n\n  How are you?\t",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return 0;\n}\n",
    '{"key": [1, 2.5, "three"], "nested": {"a": null}}',
    "<div class=\"x\">text</div> <|im_start <|endoftext <s> </s",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "a<|endoftext|>b",
    "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<think>\nhmm\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "<s>hello</s>", "<s> hello </s>", "[INST] hi [/INST]",
    "<unk>", "<0x41>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "hello <mask> world", "hello   <mask>   world", "x [R]   y", "both", "a both b", "abothb", " both ",
    "cafe\u0301 caf\u00e9 cafes", "word words sword word.", "<tool>call</tool>",
]
INVALID = [b"abc\xff\xfedef", b"\xc3\x28", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80 surrogate",
           b"\xc0\xaf overlong", b"trail\xe2\x82", b"\x80\x80 lone continuation", b"ok \xf4\x90\x80\x80 too big"]


def corpus_cases(path, n_docs=4, chars=2500):
    docs = [json.loads(line) for line in open(path, encoding="utf-8")]
    pick = [docs[i * (len(docs) - 1) // (n_docs - 1)] for i in range(n_docs)]
    return [d["text"][:chars] for d in pick]


def hf_class_ranges():
    """Code point ranges that HF's split regex treats as \p{L}, \p{N} and \s (probed by
    splitting every code point out of a string with a Removed-behaviour Split)."""
    from tokenizers import Regex, pre_tokenizers
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c != 1]
    out = {}
    for name, rx in (("letter", r"\p{L}"), ("number", r"\p{N}"), ("space", r"\s")):
        pt = pre_tokenizers.Split(Regex(rx), behavior="removed")
        members = set()
        for i in range(0, len(cps), 4096):
            chunk = cps[i:i + 4096]
            kept = set("".join(t for t, _ in pt.pre_tokenize_str("\x01".join(map(chr, chunk)))))
            members.update(c for c in chunk if chr(c) not in kept)
        ranges, start = [], None
        for c in range(0x110001):
            if c in members and start is None:
                start = c
            elif c not in members and start is not None:
                ranges.append([start, c - 1])
                start = None
        out[name] = ranges
    return out


def hf_nfc_pairs():
    """[input, HF NFC(input)] for decomposable and combining code points (Unicode 16 data)."""
    import unicodedata
    from tokenizers import normalizers
    try:
        import unicodedata2 as unicodedata  # newer data reaches more code points
    except ImportError:
        pass
    nfc = normalizers.NFC()
    inputs = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        if unicodedata.combining(ch):
            inputs += ["a" + ch + "\u0301", "\u0301" + ch + "\u0327", "\u1100" + ch]
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<"):
            inputs += [ch, unicodedata.normalize("NFD", ch), unicodedata.normalize("NFD", ch) + "\u0323"]
    inputs += ["\u1100\u1161", "\u1100\u1161\u11a8", "\uac00\u11a8", "\uac01\u11a8", "\u1100\u0301\u1161"]
    return [[s, nfc.normalize_str(s)] for s in inputs]


def load(base, patch):
    path = os.path.join(SHARED, base[len("shared:"):]) if base.startswith("shared:") else os.path.join(DATA, base)
    if not os.path.exists(path):
        return None
    j = json.load(open(path, encoding="utf-8"))
    for k, v in (patch or {}).items():  # "a.b" names key b of object a
        *path, last = k.split(".")
        obj = j
        for part in path:
            obj = obj[part]
        obj[last] = v
    return Tokenizer.from_str(json.dumps(j))


def record(tok, text):
    tok.encode_special_tokens = False
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    ids_ns = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids, ids_ns, tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", help="also write ids of the whole sotu corpus per tokenizer to this file")
    ap.add_argument("--full-only", help="comma-separated variants for --full (default: all)")
    ap.add_argument("--out", default=os.path.join(DATA, "vectors.json"))
    args = ap.parse_args()
    if tokenizers.__version__ != EXPECTED_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__} found, expected {EXPECTED_VERSION}")
    corpus = os.path.join(SHARED, "corpus", "sotu.jsonl")
    texts = [(t, None) for t in CASES] + [(t, None) for t in corpus_cases(corpus)]
    texts += [(b.decode("utf-8", "replace"), b.hex()) for b in INVALID]
    out = {"generator": "scripts/gen_tokenizer_vectors.py", "tokenizers_version": tokenizers.__version__,
           "tokenizers": []}
    full = {}
    for name, base, patch in VARIANTS:
        tok = load(base, patch)
        if tok is None:
            sys.exit(f"{name}: {base} not found")
        entry = {"name": name, "base": base, "patch": patch,
                 "vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": [], "decode": [], "tokens": []}
        for text, raw in texts:
            ids, ids_ns, dec, dec_skip = record(tok, text)
            case = {"text": text, "ids": ids}
            if raw is not None:
                case["raw_hex"] = raw
            if ids_ns != ids:
                case["ids_nospecial"] = ids_ns
            if dec != text:
                case["decoded"] = dec
            if dec_skip != dec:
                case["decoded_skip"] = dec_skip
            entry["cases"].append(case)
        rng = random.Random(1234 + len(name))
        n = tok.get_vocab_size(with_added_tokens=True)
        specials = [t["id"] for t in json.loads(tok.to_str())["added_tokens"]]
        for _ in range(40):
            ids = [rng.choice([rng.randrange(0, min(n, 400)), rng.randrange(0, n), rng.choice(specials),
                               rng.randrange(0, n + 5)]) for _ in range(rng.randrange(1, 14))]
            entry["decode"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                                    "text_skip": tok.decode(ids, skip_special_tokens=True)})
        for _ in range(20):
            i = rng.randrange(0, n + 3)
            t = tok.id_to_token(i)
            entry["tokens"].append({"id": i, "token": t})
            if t is not None:
                entry["tokens"][-1]["token_to_id"] = tok.token_to_id(t)
        out["tokenizers"].append(entry)
        if args.full and (not args.full_only or name in args.full_only.split(",")):
            docs = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
            full[name] = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        print(f"{name}: {len(entry['cases'])} cases", file=sys.stderr)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("{\"generator\": %s, \"tokenizers_version\": %s,\n" %
                (json.dumps(out["generator"]), json.dumps(out["tokenizers_version"])))
        f.write("\"classes\": %s,\n" % json.dumps(hf_class_ranges(), separators=(",", ":")))
        f.write("\"nfc\": [\n%s\n],\n" % ",\n".join(
            json.dumps(p, ensure_ascii=False) for p in hf_nfc_pairs()))
        f.write("\"tokenizers\": [\n")
        for k, entry in enumerate(out["tokenizers"]):
            head = {key: entry[key] for key in ("name", "base", "patch", "vocab_size")}
            f.write(json.dumps(head, ensure_ascii=False)[:-1])
            for key in ("cases", "decode", "tokens"):
                f.write(f', "{key}": [\n')
                f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in entry[key]))
                f.write("\n]")
            f.write("}" + (",\n" if k + 1 < len(out["tokenizers"]) else "\n"))
        f.write("]}\n")
    if args.full:
        with open(args.full, "w") as f:
            json.dump(full, f)


if __name__ == "__main__":
    main()
